package svctest

import (
	"net"
	"reflect"
	"testing"
)

// A variable that names an address where nothing answers (a typo, a
// stopped container) skips its tests with one clear line, as an unset
// variable with nothing at the standard address does, rather than fail
// each test on a refused connection after the client's retries.
func TestServiceVariableWhereNothingAnswersSkips(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing answers there now
	t.Setenv("IDEM_SVCTEST_X", addr)
	s := &service{name: "X", env: "IDEM_SVCTEST_X", def: "127.0.0.1:6379", dial: "127.0.0.1:6379", addrs: hostPort("6379")}
	want := "skip: no X: nothing answers at " + addr + " (IDEM_SVCTEST_X) within 3s"
	if v, ended := need(t, s); v != "" || ended != want {
		t.Fatalf("got %q (%q), want %q", v, ended, want)
	}
}

func TestServiceVariableThatAnswersIsUsed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	v := "db://u@" + ln.Addr().String() + "/test"
	t.Setenv("IDEM_SVCTEST_X", v)
	s := &service{name: "X", env: "IDEM_SVCTEST_X", addrs: urlHost("1")}
	if got, ended := need(t, s); got != v || ended != "" {
		t.Fatalf("got %q (%q), want %q", got, ended, v)
	}
}

// Each service reads the addresses to dial from its variable's forms; a
// form it cannot read (a Unix socket) is used without a dial.
func TestServiceAddressesToDial(t *testing.T) {
	for _, tc := range []struct {
		s    *service
		v    string
		want []string
	}{
		{postgres, "postgres://postgres@db:5433/test?sslmode=disable", []string{"db:5433"}},
		{postgres, "postgresql://u:p@db/test", []string{"db:5432"}},
		{postgres, "host=db port=5433 dbname=test", []string{"db:5433"}},
		{postgres, "host=/var/run/postgresql dbname=test", nil},
		{mysql, "root@tcp(db:3307)/test", []string{"db:3307"}},
		{mysql, "u:p@tcp(db)/test?parseTime=true", []string{"db:3306"}},
		{mysql, "root@unix(/run/mysqld.sock)/test", nil},
		{redis, "127.0.0.1:1", []string{"127.0.0.1:1"}},
		{redis, "db", []string{"db:6379"}},
		{redisCluster, "a:7000,b:7001", []string{"a:7000", "b:7001"}},
		{nats, "nats://a:4223,nats://b", []string{"a:4223", "b:4222"}},
		{amqp, "amqp://guest:guest@mq:5673/", []string{"mq:5673"}},
		{amqp, "amqps://mq/vhost", []string{"mq:5671"}},
	} {
		if got := tc.s.addrs(tc.v); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s=%q: dials %q, want %q", tc.s.env, tc.v, got, tc.want)
		}
	}
}
