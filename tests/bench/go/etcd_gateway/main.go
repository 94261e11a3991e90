// etcd_gateway: what etcd's JSON gateway costs etcd itself, against its native gRPC API, for the
// requests the bridge sends (make bench, issue 24).
//
//	etcd_gateway [-d seconds] [-etcd etcd]
//
// One etcd (started here on free loopback ports in a temp dir; defaults, fsync on) and, per row,
// the same requests two ways: JSON over HTTP/1.1 to the gateway (/v3/kv/put, /v3/kv/txn: base64
// keys and values, what lease/etcd.c sends) and protobuf over gRPC (etcd's own Go client,
// go.etcd.io/etcd/clientv3 from Debian's golang-etcd-server-dev). Shapes:
//
//	put    one put of S bytes per request (one message, one at a time: the PubAck floor)
//	txn    one txn of 1 compare (version > -1) + 1 put of S bytes: etcd_bench's "raw etcd txn",
//	       the reference of the one-at-a-time PubAck target (issue 24), on both transports
//	batch  one txn of two puts: a segment of 32 messages of S bytes back to back, and an
//	       8-byte offset (the fused plane's write of one batch)
//	fused1 (gRPC, conc 1 only) the bridge's own write of one message on the fused plane
//	       (bridge/mpsc_prod.c): 3 compares (produce offset value == the previous one, the
//	       membership and the channel meta exist) + 2 puts under 2 leases (a segment of one
//	       encoded message, and the produce offset), keys as long as the bridge's: the txn a
//	       one-at-a-time PubAck waits for, so row 5n's floor without NATS and the bridge.
//	       Twice: back to back, and with etcd idle between requests (a one-at-a-time
//	       publisher's requests reach etcd 0.3-0.4 ms apart: the NATS legs of each PubAck; an
//	       idle etcd answers slower). The row asks for 0.4 ms; Go's timer makes it about 1.2 ms
//	       here, so the row prints the idle time measured.
//
// For each row it prints requests/s, messages/s, the p50 latency and etcd's CPU (utime + stime of
// its process, /proc/<pid>/stat) per request and per message. The two transports of a row run
// back to back (their order alternates from row to row), and the store is compacted between
// rows. Exit 1 on any failed call; etcd is killed and its directory removed at exit.
package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/clientv3"
)

const segMsgs = 32

type shape struct {
	name string
	size int
	msgs int           // messages per request
	gap  time.Duration // fused1: idle time between requests
}

type result struct {
	reqs, msgs float64 // per second
	p50        time.Duration
	cpuReq     float64       // etcd CPU µs per request
	gap        time.Duration // mean idle time between a worker's requests (shape gap)
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail("no free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

var cleanup []func()

func fail(f string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "etcd_gateway: "+f+"\n", a...)
	for i := len(cleanup) - 1; i >= 0; i-- {
		cleanup[i]()
	}
	os.Exit(1)
}

// cpuTicks: utime + stime of pid in clock ticks (USER_HZ = 100 on Linux).
func cpuTicks(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		fail("etcd gone: %v", err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return u + k
}

func startEtcd(bin string) (string, string, int) {
	dir, err := os.MkdirTemp(os.Getenv("FXT_TMPDIR"), "etcd-gw-")
	if err != nil {
		fail("temp dir: %v", err)
	}
	cleanup = append(cleanup, func() { os.RemoveAll(dir) })
	cp, pp := freePort(), freePort()
	curl := fmt.Sprintf("http://127.0.0.1:%d", cp)
	purl := fmt.Sprintf("http://127.0.0.1:%d", pp)
	cmd := exec.Command(bin, "--name=gw", "--data-dir="+filepath.Join(dir, "data"),
		"--listen-client-urls="+curl, "--advertise-client-urls="+curl,
		"--listen-peer-urls="+purl, "--initial-advertise-peer-urls="+purl,
		"--initial-cluster=gw="+purl, "--initial-cluster-state=new",
		"--logger=zap", "--log-level=warn")
	log, _ := os.Create(filepath.Join(dir, "etcd.log"))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fail("start %s: %v", bin, err)
	}
	cleanup = append(cleanup, func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := http.Get(curl + "/health")
		if err == nil {
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if bytes.Contains(b, []byte(`"true"`)) {
				break
			}
		}
		if time.Now().After(deadline) {
			fail("etcd not healthy on %s after 30 s (log %s)", curl, log.Name())
		}
		time.Sleep(50 * time.Millisecond) // poll with a deadline
	}
	return curl, fmt.Sprintf("127.0.0.1:%d", cp), cmd.Process.Pid
}

type doer func(ctx context.Context, w, i int) error

func key(w, i int) string { return fmt.Sprintf("/gwbench/%d/%d", w, i%1024) }

func gatewayDoer(url string, sh shape, conc int) doer {
	tr := &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc, DisableCompression: true}
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	val := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{'x'}, sh.size*sh.msgs))
	off := base64.StdEncoding.EncodeToString([]byte("00000001"))
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	return func(ctx context.Context, w, i int) error {
		var path string
		var body []byte
		if sh.name == "txn" { // etcd_bench's raw txn: 1 compare (version > -1) + 1 put
			path = "/v3/kv/txn"
			k := b64(key(w, i))
			body, _ = json.Marshal(map[string]interface{}{
				"compare": []interface{}{map[string]string{"key": k, "target": "VERSION", "result": "GREATER", "version": "-1"}},
				"success": []interface{}{map[string]interface{}{"request_put": map[string]string{"key": k, "value": val}}}})
		} else if sh.msgs == 1 {
			path = "/v3/kv/put"
			body, _ = json.Marshal(map[string]string{"key": b64(key(w, i)), "value": val})
		} else {
			path = "/v3/kv/txn"
			put := func(k, v string) map[string]interface{} {
				return map[string]interface{}{"request_put": map[string]string{"key": b64(k), "value": v}}
			}
			body, _ = json.Marshal(map[string]interface{}{"success": []interface{}{
				put(key(w, i), val), put(fmt.Sprintf("/gwbench/off/%d", w), off)}})
		}
		req, _ := http.NewRequestWithContext(ctx, "POST", url+path, bytes.NewReader(body))
		r, err := hc.Do(req)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 200 || !bytes.Contains(b, []byte(`"revision"`)) {
			return fmt.Errorf("%s: HTTP %d: %.200s", path, r.StatusCode, b)
		}
		return nil
	}
}

// fusedDoer: the bridge's one-message write (the fused1 shape), on one worker.
func fusedDoer(c *clientv3.Client, sh shape) doer {
	const root = "/fxbench/kv/mpmc_channels/1/chan/1"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var leases [2]clientv3.LeaseID
	for j := range leases {
		g, err := c.Grant(ctx, 600)
		if err != nil {
			fail("fused1: lease grant: %v", err)
		}
		leases[j] = g.ID
	}
	member, meta := root+"/members/consumer/0000000001", "/fxbench/mpmc_channels/0000000001/meta"
	for _, k := range []string{member, meta} {
		if _, err := c.Put(ctx, k, "1", clientv3.WithLease(leases[1])); err != nil {
			fail("fused1: put %s: %v", k, err)
		}
	}
	// a segment of one message: "FXS1", n, length, the encoded record (subject, headers, time)
	seg := string(bytes.Repeat([]byte{'x'}, 8+4+sh.size+48))
	run := fmt.Sprintf("%d", time.Now().UnixNano()) // fresh keys per doer
	off := root + "/produce_offset/" + run
	prev := ""
	return func(ctx context.Context, w, i int) error {
		next := fmt.Sprintf("%s/%020d", run, i)
		cmp := clientv3.Compare(clientv3.CreateRevision(off), "=", 0)
		if prev != "" {
			cmp = clientv3.Compare(clientv3.Value(off), "=", prev)
		}
		r, err := c.Txn(ctx).If(cmp,
			clientv3.Compare(clientv3.CreateRevision(member), ">", 0),
			clientv3.Compare(clientv3.CreateRevision(meta), ">", 0)).
			Then(clientv3.OpPut(fmt.Sprintf("%s/payload/0000000001/%020d", root, i), seg, clientv3.WithLease(leases[0])),
				clientv3.OpPut(off, next, clientv3.WithLease(leases[1]))).Commit()
		if err == nil && !r.Succeeded {
			return fmt.Errorf("fused1: compare failed")
		}
		prev = next
		return err
	}
}

func grpcDoer(c *clientv3.Client, sh shape) doer {
	val := string(bytes.Repeat([]byte{'x'}, sh.size*sh.msgs))
	return func(ctx context.Context, w, i int) error {
		if sh.name == "txn" {
			k := key(w, i)
			r, err := c.Txn(ctx).If(clientv3.Compare(clientv3.Version(k), ">", -1)).Then(clientv3.OpPut(k, val)).Commit()
			if err == nil && !r.Succeeded {
				err = fmt.Errorf("txn: compare failed")
			}
			return err
		}
		if sh.msgs == 1 {
			_, err := c.Put(ctx, key(w, i), val)
			return err
		}
		_, err := c.Txn(ctx).Then(clientv3.OpPut(key(w, i), val),
			clientv3.OpPut(fmt.Sprintf("/gwbench/off/%d", w), "00000001")).Commit()
		return err
	}
}

func run(do doer, sh shape, conc int, dur time.Duration, pid int, stop *atomic.Bool) result {
	// warm-up (connections, etcd's caches), then the measured window
	for phase := 0; phase < 2; phase++ {
		d := 500 * time.Millisecond
		if phase == 1 {
			d = dur
		}
		var wg sync.WaitGroup
		lat := make([][]time.Duration, conc)
		gaps := make([]time.Duration, conc)
		var errOnce sync.Once
		var firstErr error
		c0 := cpuTicks(pid)
		t0 := time.Now()
		end := t0.Add(d)
		for w := 0; w < conc; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				var last time.Time
				for i := 0; time.Now().Before(end) && !stop.Load(); i++ {
					if sh.gap > 0 && i > 0 {
						time.Sleep(sh.gap) // idle, outside the timed request
					}
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					s := time.Now()
					if i > 0 {
						gaps[w] += s.Sub(last)
					}
					err := do(ctx, w, i)
					last = time.Now()
					cancel()
					if err != nil {
						errOnce.Do(func() { firstErr = err })
						return
					}
					lat[w] = append(lat[w], time.Since(s))
				}
			}(w)
		}
		wg.Wait()
		el := time.Since(t0).Seconds()
		c1 := cpuTicks(pid)
		if firstErr != nil {
			fail("%s %d B: %v", sh.name, sh.size, firstErr)
		}
		if phase == 0 {
			continue
		}
		var all []time.Duration
		for _, l := range lat {
			all = append(all, l...)
		}
		if len(all) == 0 {
			fail("%s %d B: no request completed", sh.name, sh.size)
		}
		sort.Slice(all, func(a, b int) bool { return all[a] < all[b] })
		n := float64(len(all))
		var gap time.Duration
		for _, g := range gaps {
			gap += g
		}
		return result{reqs: n / el, msgs: n * float64(sh.msgs) / el, p50: all[len(all)/2],
			cpuReq: (c1 - c0) * 1e6 / 100 / n, gap: gap / time.Duration(len(all))}
	}
	return result{}
}

// printRow: one row of the table (the header is printed in main).
func printRow(sh shape, conc int, transport string, r result) {
	fmt.Printf("| %s | %d B | %d | %s | %.0f | %.0f | %.2f ms | %.0f | %.1f |\n", sh.name, sh.size, conc, transport,
		r.reqs, r.msgs, float64(r.p50.Microseconds())/1000, r.cpuReq, r.cpuReq/float64(sh.msgs))
}

// compact what a row wrote, so rows do not pay for each other's history
func compact(c *clientv3.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := c.Get(ctx, "/gwbench/off/0")
	if err == nil {
		_, err = c.Compact(ctx, g.Header.Revision)
	}
	if err != nil {
		fail("compact: %v", err)
	}
}

func main() {
	secs := flag.Float64("d", 3, "seconds per measured window")
	bin := flag.String("etcd", "etcd", "etcd binary")
	flag.Parse()
	var stop atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; stop.Store(true) }()

	url, ep, pid := startEtcd(*bin)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second})
	if err != nil {
		fail("gRPC client: %v", err)
	}
	defer c.Close()
	dur := time.Duration(*secs * float64(time.Second))
	fmt.Printf("etcd pid %d, %s per window after 0.5 s warm-up; etcd CPU from /proc/%d/stat (10 ms ticks)\n\n", pid, dur, pid)
	fmt.Println("| shape | size | conc | transport | req/s | msgs/s | p50 | etcd CPU µs/req | etcd CPU µs/msg |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	var ratios []string
	row := 0
	for _, sh := range []shape{{"put", 128, 1, 0}, {"put", 4096, 1, 0}, {"txn", 128, 1, 0}, {"fused1", 128, 1, 0},
		{"fused1", 128, 1, 400 * time.Microsecond}, {"batch", 128, segMsgs, 0}, {"batch", 4096, segMsgs, 0}} {
		if sh.name == "fused1" { // gRPC only (the bridge's transport), right after the txn rows
			r := run(fusedDoer(c, sh), sh, 1, dur, pid, &stop)
			tp := "gRPC"
			if sh.gap > 0 {
				tp = fmt.Sprintf("gRPC, idle %.2f ms between requests", r.gap.Seconds()*1000)
			}
			printRow(sh, 1, tp, r)
			compact(c)
			continue
		}
		for _, conc := range []int{1, 8} {
			res := map[string]result{}
			order := []string{"gateway", "grpc"}
			if row%2 == 1 {
				order = []string{"grpc", "gateway"}
			}
			row++
			for _, tp := range order {
				if stop.Load() {
					fail("interrupted")
				}
				var do doer
				if tp == "gateway" {
					do = gatewayDoer(url, sh, conc)
				} else {
					do = grpcDoer(c, sh)
				}
				r := run(do, sh, conc, dur, pid, &stop)
				res[tp] = r
				label := "JSON gateway"
				if tp == "grpc" {
					label = "gRPC"
				}
				printRow(sh, conc, label, r)
				compact(c)
			}
			g, j := res["grpc"], res["gateway"]
			ratios = append(ratios, fmt.Sprintf("- %s %d B, conc %d: gRPC/gateway throughput %.2fx, p50 %.2fx, etcd CPU per request %.2fx",
				sh.name, sh.size, conc, g.reqs/j.reqs, float64(g.p50)/float64(j.p50), g.cpuReq/j.cpuReq))
		}
	}
	fmt.Println()
	fmt.Println(strings.Join(ratios, "\n"))
	for i := len(cleanup) - 1; i >= 0; i-- {
		cleanup[i]()
	}
}
