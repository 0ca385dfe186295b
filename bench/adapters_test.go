package bench

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/labstack/echo/v4"
	"github.com/seed094d4201/idem"
	"github.com/seed094d4201/idem/idemgrpc"
	"github.com/seed094d4201/idem/idemhttp"
	"github.com/seed094d4201/idem/idemhttp/idemecho"
	"github.com/seed094d4201/idem/idemhttp/idemgin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// serveHTTP runs h once per iteration on one POST, with the key key(i), and
// checks that the response is the 1 KiB charge.
func serveHTTP(b *testing.B, h http.Handler, key func(i int) string) {
	b.Helper()
	reqBody := []byte(`{"order":101,"amount":450}`)
	body := bytes.NewReader(reqBody)
	req := httptest.NewRequest(http.MethodPost, "/charges", body)
	w := httptest.NewRecorder()
	req.Header.Set(idemhttp.Header, key(-1))
	h.ServeHTTP(w, req)
	if w.Body.Len() < 1000 {
		b.Fatalf("response is %d bytes, want about 1 KiB", w.Body.Len())
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		body.Reset(reqBody)
		req.Header.Set(idemhttp.Header, key(i))
		w.Body.Reset()
		clear(w.Header())
		h.ServeHTTP(w, req)
	}
}

// adapterApps build the 1 KiB charge handler in each framework's own style,
// bare or guarded by its adapter.
var adapterApps = []struct {
	name string
	app  func(store *idem.Store[idemhttp.Response]) http.Handler // store nil: bare
}{
	{"gin", func(store *idem.Store[idemhttp.Response]) http.Handler {
		gin.SetMode(gin.ReleaseMode)
		r := gin.New()
		if store != nil {
			r.Use(idemgin.Middleware(store, idemgin.Options{}))
		}
		r.POST("/charges", func(c *gin.Context) {
			_, _ = io.Copy(io.Discard, c.Request.Body)
			c.JSON(http.StatusCreated, charge)
		})
		return r
	}},
	{"echo", func(store *idem.Store[idemhttp.Response]) http.Handler {
		e := echo.New()
		if store != nil {
			e.Use(idemecho.Middleware(store, idemecho.Options{}))
		}
		e.POST("/charges", func(c echo.Context) error {
			_, _ = io.Copy(io.Discard, c.Request().Body)
			return c.JSON(http.StatusCreated, charge)
		})
		return e
	}},
}

// BenchmarkAdapters measures what the gin and echo adapters add to their
// framework's bare handler, for a first request and a replay of the 1 KiB
// response, in process.
func BenchmarkAdapters(b *testing.B) {
	for _, a := range adapterApps {
		newStore := func(b *testing.B) *idem.Store[idemhttp.Response] {
			s := idem.New[idemhttp.Response](idem.Options{})
			b.Cleanup(func() { s.Close() })
			return s
		}
		b.Run("adapter="+a.name+"/impl=bare", func(b *testing.B) {
			serveHTTP(b, a.app(nil), func(int) string { return "k" })
		})
		b.Run("adapter="+a.name+"/impl=idem-first", func(b *testing.B) {
			keys := makeKeys(b.N + 1)
			serveHTTP(b, a.app(newStore(b)), func(i int) string { return keys[i+1] })
		})
		b.Run("adapter="+a.name+"/impl=idem-replay", func(b *testing.B) {
			serveHTTP(b, a.app(newStore(b)), func(int) string { return "16fd2706-8baf-433b-82eb-8c7fada847da" })
		})
	}
}

// stream is the smallest grpc.ServerTransportStream, so that the
// interceptor's SetHeader and SetTrailer have somewhere to go.
type stream struct{}

func (stream) Method() string                  { return "/bench.Payments/Charge" }
func (stream) SetHeader(metadata.MD) error     { return nil }
func (stream) SendHeader(metadata.MD) error    { return nil }
func (stream) SetTrailer(md metadata.MD) error { return nil }

// BenchmarkGRPC measures what the server interceptor adds to a unary
// handler that builds a 1 KiB response message, called in process as gRPC
// calls it (no network, no encoding of the reply).
func BenchmarkGRPC(b *testing.B) {
	fields := map[string]any{"id": charge.ID, "status": charge.Status, "amount": float64(charge.Amount)}
	for k, v := range charge.Metadata {
		fields[k] = v
	}
	handler := func(ctx context.Context, req any) (any, error) { return structpb.NewStruct(fields) }
	req, _ := structpb.NewStruct(map[string]any{"order": 101.0, "amount": 450.0})
	info := &grpc.UnaryServerInfo{FullMethod: "/bench.Payments/Charge"}
	base := grpc.NewContextWithServerTransportStream(context.Background(), stream{})
	run := func(b *testing.B, call grpc.UnaryServerInterceptor, key func(i int) string) {
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			ctx := metadata.NewIncomingContext(base, metadata.Pairs(idemgrpc.KeyHeader, key(i)))
			if _, err := call(ctx, req, info, handler); err != nil {
				b.Fatal(err)
			}
		}
	}
	bare := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, req)
	}
	guarded := func(b *testing.B) grpc.UnaryServerInterceptor {
		s := idem.New[idemgrpc.Reply](idem.Options{})
		b.Cleanup(func() { s.Close() })
		return idemgrpc.UnaryServerInterceptor(s, idemgrpc.Options{})
	}
	b.Run("impl=bare", func(b *testing.B) { run(b, bare, func(int) string { return "k" }) })
	b.Run("impl=idem-first", func(b *testing.B) {
		keys := makeKeys(b.N)
		run(b, guarded(b), func(i int) string { return keys[i] })
	})
	b.Run("impl=idem-replay", func(b *testing.B) {
		run(b, guarded(b), func(int) string { return "16fd2706-8baf-433b-82eb-8c7fada847da" })
	})
}
