// Command grpc-go-client times Allocate against a no-op unary RPC (GetDevicePluginOptions) on a
// device plugin's Unix socket, from grpc-go, the gRPC stack the kubelet uses, dialled with the
// kubelet's options (authority "localhost", insecure, blocking, a Unix-socket context dialer). It is run by
// `cargo bench --bench allocate`, which passes the socket and the encoded AllocateRequest.
//
// With -references NAME=SOCKET,... each iteration also makes the same two calls on other plugins,
// each on its own connection (so all carry the same load): kinds "NAME-noop" and
// "NAME-allocate" in the output. The same binary is a reference plugin when
// run with -serve SOCKET: a grpc-go device plugin that does no work and answers
// GetDevicePluginOptions and Allocate with the bytes given (-options, -answer: those dxdp
// answers), so that dxdp's Allocate can be compared with the least any grpc-go plugin can do.
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
	"strings"
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

// String names the codec for grpc.CustomCodec (grpc-go 1.33, Debian's).
func (rawCodec) String() string { return "proto" }

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

// target is a plugin the series calls: its kinds in the output are <prefix>noop and
// <prefix>allocate.
type target struct {
	prefix string
	conn   *grpc.ClientConn
}

// series runs `callers` goroutines, each making, per iteration, the no-op and Allocate on every
// target in turn (each on its own connection, so that all carry the same load), and prints the
// percentiles of each kind.
func series(targets []target, allocate []byte, callers, iterations int) error {
	perCaller := (iterations + callers - 1) / callers
	var mu sync.Mutex
	times := make([][2][]time.Duration, len(targets))
	var firstErr error
	var wg sync.WaitGroup
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([][2][]time.Duration, len(targets))
			// timed makes one call and records its time; false (the first error kept) on failure.
			timed := func(c *grpc.ClientConn, method string, req []byte, into *[]time.Duration) bool {
				t := time.Now()
				if err := call(c, method, req); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return false
				}
				*into = append(*into, time.Since(t))
				return true
			}
			for i := 0; i < perCaller; i++ {
				for k, t := range targets {
					if !timed(t.conn, noopMethod, nil, &mine[k][0]) ||
						!timed(t.conn, allocateMethod, allocate, &mine[k][1]) {
						return
					}
				}
			}
			mu.Lock()
			for k := range targets {
				times[k][0] = append(times[k][0], mine[k][0]...)
				times[k][1] = append(times[k][1], mine[k][1]...)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	for k, t := range targets {
		for j, kind := range []string{"noop", "allocate"} {
			d := times[k][j]
			sort.Slice(d, func(a, b int) bool { return d[a] < d[b] })
			fmt.Printf("series %d %s%s %d %d %d %d\n", callers, t.prefix, kind, len(d),
				percentile(d, 0.50).Nanoseconds(), percentile(d, 0.90).Nanoseconds(),
				percentile(d, 0.99).Nanoseconds())
		}
	}
	return nil
}

// answering is a unary handler that reads the request and answers `answer`, doing no other work.
func answering(answer []byte) func(interface{}, context.Context, func(interface{}) error, grpc.UnaryServerInterceptor) (interface{}, error) {
	return func(_ interface{}, _ context.Context, dec func(interface{}) error, _ grpc.UnaryServerInterceptor) (interface{}, error) {
		var request []byte
		if err := dec(&request); err != nil {
			return nil, err
		}
		out := answer
		return &out, nil
	}
}

// serve runs the reference plugin on `socket` until the process is killed.
func serve(socket string, options, answer []byte) error {
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", socket, err)
	}
	server := grpc.NewServer(grpc.CustomCodec(rawCodec{}))
	server.RegisterService(&grpc.ServiceDesc{
		ServiceName: "v1beta1.DevicePlugin",
		HandlerType: (*interface{})(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: "GetDevicePluginOptions", Handler: answering(options)},
			{MethodName: "Allocate", Handler: answering(answer)},
		},
	}, struct{}{})
	return server.Serve(listener)
}

// dial connects to a device plugin's socket with the kubelet's options.
func dial(socket string) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, socket, grpc.WithAuthority("localhost"),
		grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", socket, err)
	}
	return conn, nil
}

func run() error {
	socket := flag.String("socket", "", "the plugin's Unix socket")
	allocateHex := flag.String("allocate", "", "the AllocateRequest, protobuf-encoded, in hex")
	iterations := flag.Int("iterations", 3000, "calls of each kind per series")
	warmup := flag.Int("warmup", 200, "calls of each kind before the series")
	references := flag.String("references", "", "other plugins to call alike: NAME=PATH[,NAME=PATH] (optional)")
	serveSocket := flag.String("serve", "", "be the reference plugin on this Unix socket")
	optionsHex := flag.String("options", "", "with -serve: the DevicePluginOptions answer, in hex")
	answerHex := flag.String("answer", "", "with -serve: the AllocateResponse answer, in hex")
	flag.Parse()
	if *serveSocket != "" {
		options, err1 := hex.DecodeString(*optionsHex)
		answer, err2 := hex.DecodeString(*answerHex)
		if err1 != nil || err2 != nil || len(answer) == 0 {
			return fmt.Errorf("usage: -serve PATH -options HEX -answer HEX")
		}
		return serve(*serveSocket, options, answer)
	}
	allocate, err := hex.DecodeString(*allocateHex)
	if err != nil || *socket == "" {
		return fmt.Errorf("usage: -socket PATH -allocate HEX [-iterations N] [-references NAME=PATH,...]")
	}
	conn, err := dial(*socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	targets := []target{{prefix: "", conn: conn}}
	for _, ref := range strings.Split(*references, ",") {
		if ref == "" {
			continue
		}
		name, path := ref, ""
		if i := strings.Index(ref, "="); i > 0 {
			name, path = ref[:i], ref[i+1:]
		}
		if path == "" {
			return fmt.Errorf("-references: %q is not NAME=PATH", ref)
		}
		c, err := dial(path)
		if err != nil {
			return err
		}
		defer c.Close()
		targets = append(targets, target{prefix: name + "-", conn: c})
	}
	for i := 0; i < *warmup; i++ {
		for _, t := range targets {
			if err := call(t.conn, noopMethod, nil); err != nil {
				return err
			}
			if err := call(t.conn, allocateMethod, allocate); err != nil {
				return err
			}
		}
	}
	for _, callers := range []int{1, 64} {
		if err := series(targets, allocate, callers, *iterations); err != nil {
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
