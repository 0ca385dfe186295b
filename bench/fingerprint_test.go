package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemhttp"
)

// fingerprintOrder is one element of the JSON body BenchmarkJSONFingerprint
// fingerprints: strings (some escaped, some not ASCII), integers, decimals,
// booleans, null, and objects and arrays nested three deep, its fields in
// struct order rather than sorted, as most encoders write them.
type fingerprintOrder struct {
	ID       string  `json:"id"`
	Amount   int     `json:"amount"`
	Price    float64 `json:"price"`
	Currency string  `json:"currency"`
	Paid     bool    `json:"paid"`
	Customer struct {
		Name    string `json:"name"`
		Email   string `json:"email"`
		Address struct {
			Line1 string `json:"line1"`
			City  string `json:"city"`
			Zip   string `json:"zip"`
		} `json:"address"`
	} `json:"customer"`
	Items []fingerprintItem `json:"items"`
	Tags  []string          `json:"tags"`
	Note  *string           `json:"note"`
}

type fingerprintItem struct {
	SKU  string  `json:"sku"`
	Qty  int     `json:"qty"`
	Unit float64 `json:"unit_price"`
}

// fingerprintBody is a JSON array of orders, size bytes long or one order
// more.
func fingerprintBody(size int) []byte {
	body := []byte{'['}
	for i := 0; len(body) < size; i++ {
		var o fingerprintOrder
		o.ID, o.Amount, o.Price = fmt.Sprintf("ord_%08d", i), 100+i*7%90000, float64(i%5000)/100
		o.Currency, o.Paid = "EUR", i%3 != 0
		o.Customer.Name = fmt.Sprintf("Zoë \"Z\" Müller-%d", i)
		o.Customer.Email = fmt.Sprintf("zoe.%d@example.com", i)
		o.Customer.Address.Line1 = fmt.Sprintf("%d Hohe Straße <Hinterhaus>", i%300)
		o.Customer.Address.City, o.Customer.Address.Zip = "Köln", fmt.Sprintf("50%03d", i%1000)
		for j := range 1 + i%3 {
			o.Items = append(o.Items, fingerprintItem{fmt.Sprintf("sku-%05d", i*3+j), 1 + j, 4.5 + float64(j)})
		}
		o.Tags = []string{"gift", "express"}[:i%3]
		if i%4 == 0 {
			note := "leave at the door & ring twice"
			o.Note = &note
		}
		if i > 0 {
			body = append(body, ',')
		}
		order, err := json.Marshal(o)
		if err != nil {
			panic(err)
		}
		body = append(body, order...)
	}
	return append(body, ']')
}

// decodeEncodeFingerprint is JSONFingerprint as it was before issue 22: the
// body decoded into any, encoded again with sorted keys, and hashed.
func decodeEncodeFingerprint(r *http.Request, body []byte) (idem.Fingerprint, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return idemhttp.RequestFingerprint(r, nil)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return idem.Fingerprint{}, fmt.Errorf("request body is not JSON: %w", err)
	}
	if dec.More() {
		return idem.Fingerprint{}, fmt.Errorf("request body holds more than one JSON value")
	}
	canonical, err := json.Marshal(v)
	if err != nil {
		return idem.Fingerprint{}, err
	}
	return idemhttp.RequestFingerprint(r, canonical)
}

// BenchmarkJSONFingerprint: fingerprinting a 1 MiB and a 10 MiB JSON body
// of orders with the one-pass canonical scanner (idem) and with the old
// decode into any and encode again (decode-encode).
func BenchmarkJSONFingerprint(b *testing.B) {
	impls := []struct {
		name string
		fp   func(*http.Request, []byte) (idem.Fingerprint, error)
	}{{"idem", idemhttp.JSONFingerprint}, {"decode-encode", decodeEncodeFingerprint}}
	for _, size := range []int{1, 10} {
		body := fingerprintBody(size << 20)
		for _, impl := range impls {
			b.Run(fmt.Sprintf("size=%dMiB/impl=%s", size, impl.name), func(b *testing.B) {
				r := httptest.NewRequest(http.MethodPost, "/orders?batch=1", nil)
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := impl.fp(r, body); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
