package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// payments is the client of a payments service that honours a step key:
// a charge sent again with the key of one already made makes no second
// charge and answers the first one's ID. The kill loop runs such a
// service; the worker's effect is then remote.
type payments struct{ url string }

// charge charges amount for the event key under stepKey, and returns the
// charge's ID.
func (p *payments) charge(ctx context.Context, stepKey, key string, amount int) (int, error) {
	v := url.Values{"step": {stepKey}, "event": {key}, "amount": {strconv.Itoa(amount)}}
	return p.call(ctx, http.MethodPost, "/charge", v)
}

// lookup says whether the event key was charged, and the charge's ID.
func (p *payments) lookup(ctx context.Context, key string) (int, bool, error) {
	id, err := p.call(ctx, http.MethodGet, "/charge", url.Values{"event": {key}})
	if err == errNotFound {
		return 0, false, nil
	}
	return id, err == nil, err
}

var errNotFound = fmt.Errorf("payments: no such charge")

func (p *payments) call(ctx context.Context, method, path string, v url.Values) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, p.url+path+"?"+v.Encode(), nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return 0, err
	case resp.StatusCode == http.StatusNotFound:
		return 0, errNotFound
	case resp.StatusCode != http.StatusOK:
		return 0, fmt.Errorf("payments: %s: %s", resp.Status, body)
	}
	return strconv.Atoi(strings.TrimSpace(string(body)))
}
