// Command grpc-go-client times Allocate against a no-op unary RPC (GetDevicePluginOptions) on a
// device plugin's Unix socket, from grpc-go, the gRPC stack the kubelet uses, dialled with the
// kubelet's options (authority "localhost", insecure, blocking, a Unix-socket context dialer). It is run by
// `cargo bench --bench allocate`, which passes the socket and the encoded AllocateRequest.
//
// The messages are passed through as bytes (a pass-through codec), so no generated code is
// needed: the no-op request is the empty message, the Allocate request is given in hex.
//
// Output: one line per series and kind, "series <callers> <kind> <calls> <p50_ns> <p90_ns> <p99_ns>".
package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// rawCodec passes messages through as bytes.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: unexpected %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: unexpected %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

const (
	noopMethod     = "/v1beta1.DevicePlugin/GetDevicePluginOptions"
	allocateMethod = "/v1beta1.DevicePlugin/Allocate"
)

func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted)-1)*p + 0.5)
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}

func call(conn *grpc.ClientConn, method string, req []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var resp []byte
	return conn.Invoke(ctx, method, &req, &resp, grpc.ForceCodec(rawCodec{}))
}

// series runs `callers` goroutines on the one connection, each interleaving the no-op and
// Allocate, and prints the percentiles of each kind.
func series(conn *grpc.ClientConn, allocate []byte, callers, iterations int) error {
	perCaller := (iterations + callers - 1) / callers
	var mu sync.Mutex
	var noop, alloc []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := make([]time.Duration, 0, perCaller)
			a := make([]time.Duration, 0, perCaller)
			for i := 0; i < perCaller; i++ {
				t := time.Now()
				if err := call(conn, noopMethod, nil); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				n = append(n, time.Since(t))
				t = time.Now()
				if err := call(conn, allocateMethod, allocate); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				a = append(a, time.Since(t))
			}
			mu.Lock()
			noop = append(noop, n...)
			alloc = append(alloc, a...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	for _, kind := range []struct {
		name string
		d    []time.Duration
	}{{"noop", noop}, {"allocate", alloc}} {
		sort.Slice(kind.d, func(i, j int) bool { return kind.d[i] < kind.d[j] })
		fmt.Printf("series %d %s %d %d %d %d\n", callers, kind.name, len(kind.d),
			percentile(kind.d, 0.50).Nanoseconds(), percentile(kind.d, 0.90).Nanoseconds(),
			percentile(kind.d, 0.99).Nanoseconds())
	}
	return nil
}

func run() error {
	socket := flag.String("socket", "", "the plugin's Unix socket")
	allocateHex := flag.String("allocate", "", "the AllocateRequest, protobuf-encoded, in hex")
	iterations := flag.Int("iterations", 3000, "calls of each kind per series")
	warmup := flag.Int("warmup", 200, "calls of each kind before the series")
	flag.Parse()
	allocate, err := hex.DecodeString(*allocateHex)
	if err != nil || *socket == "" {
		return fmt.Errorf("usage: -socket PATH -allocate HEX [-iterations N]")
	}
	// The kubelet's dial options for a device plugin endpoint.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, *socket, grpc.WithAuthority("localhost"),
		grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		return fmt.Errorf("dial %s: %w", *socket, err)
	}
	defer conn.Close()
	for i := 0; i < *warmup; i++ {
		if err := call(conn, noopMethod, nil); err != nil {
			return err
		}
		if err := call(conn, allocateMethod, allocate); err != nil {
			return err
		}
	}
	for _, callers := range []int{1, 64} {
		if err := series(conn, allocate, callers, *iterations); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "grpc-go client:", err)
		os.Exit(1)
	}
}
