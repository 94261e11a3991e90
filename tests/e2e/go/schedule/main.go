// schedule: delayed publishes from the nats.go client (Debian golang-github-nats-io-go-nats-dev).
// Run by tests/e2e/53_schedule_header_compat.test.mjs (compat mode) and
// tests/e2e/55_delayed_scale.test.mjs (flood mode); built offline in GOPATH mode.
//
//	schedule -url nats://... -subject orders.go -n 50 -first 1000 -spread 2000
//	    js.PublishMsg of n messages on ONE subject, each with "Nats-Schedule: @at <RFC 3339>"
//	    (first + i*spread/n ms from its send time), then the refused forms; prints one JSON line
//	    per publish: {"id","due_ms","ok","err","code"}.
//	schedule -flood -url ... -subject orders.far -n 1000000 -inflight 4096 -delay 24h
//	    PublishMsgAsync of n messages with "Fluxon-Delay: <delay>", at most inflight unacked;
//	    prints {"acked","failed","seconds","rate"}.
//
// Message bodies follow tests/e2e/lib/client.mjs makeMsg: {"id","n","subject"} "\n" tail(n).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
)

func tail(n int) []byte {
	l := 16 + n%48
	b := make([]byte, l)
	x := uint32(uint64(n) * 2654435761)
	for i := 0; i < l; i++ {
		x = x*1103515245 + 12345
		b[i] = byte((x >> 16) & 0xff)
	}
	return b
}

func body(id string, n int, subject string) []byte {
	h, _ := json.Marshal(map[string]interface{}{"id": id, "n": n, "subject": subject})
	return append(append(h, '\n'), tail(n)...)
}

type result struct {
	ID    string `json:"id"`
	DueMs int64  `json:"due_ms"`
	OK    bool   `json:"ok"`
	Err   string `json:"err,omitempty"`
	Code  int    `json:"code,omitempty"`
	Hdr   string `json:"hdr,omitempty"`
}

func main() {
	url := flag.String("url", nats.DefaultURL, "")
	subject := flag.String("subject", "orders.go", "")
	n := flag.Int("n", 50, "")
	first := flag.Int("first", 1000, "ms")
	spread := flag.Int("spread", 2000, "ms")
	tooFar := flag.Duration("too-far", 2*time.Hour, "a delay above the channel's max_delay")
	flood := flag.Bool("flood", false, "")
	inflight := flag.Int("inflight", 4096, "")
	delay := flag.String("delay", "24h", "")
	flag.Parse()
	nc, err := nats.Connect(*url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer nc.Close()
	if *flood {
		os.Exit(runFlood(nc, *subject, *n, *inflight, *delay))
	}
	js, err := nc.JetStream()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	pub := func(id string, i int, hdr string) {
		m := nats.NewMsg(*subject)
		m.Data = body(id, i, *subject)
		m.Header.Set("X-Id", id)
		m.Header.Set("Nats-Schedule", hdr)
		r := result{ID: id, Hdr: hdr}
		_, err := js.PublishMsg(m)
		if err == nil {
			r.OK = true
		} else {
			r.Err = err.Error()
			if ae, ok := err.(*nats.APIError); ok {
				r.Code = ae.Code
			}
		}
		out.Encode(&r)
	}
	for i := 0; i < *n; i++ {
		due := time.Now().Add(time.Duration(*first+i**spread / *n) * time.Millisecond)
		hdr := "@at " + due.UTC().Format(time.RFC3339Nano)
		m := nats.NewMsg(*subject)
		id := fmt.Sprintf("go-%d", i)
		m.Data = body(id, i, *subject)
		m.Header.Set("X-Id", id)
		m.Header.Set("Nats-Schedule", hdr)
		r := result{ID: id, DueMs: due.UnixMilli(), Hdr: hdr}
		if _, err := js.PublishMsg(m); err != nil {
			r.Err = err.Error()
		} else {
			r.OK = true
		}
		out.Encode(&r)
	}
	// refused: malformed, other schedule forms, too far
	pub("go-bad-0", 100000, "@at tomorrow")
	pub("go-bad-1", 100001, "@every 1m")
	pub("go-bad-2", 100002, "0 30 * * * *")
	pub("go-bad-3", 100003, "@at 2026-13-01T00:00:00Z")
	pub("go-bad-4", 100004, "@at "+time.Now().Add(*tooFar).UTC().Format(time.RFC3339))
}

func runFlood(nc *nats.Conn, subject string, n, inflight int, delay string) int {
	js, err := nc.JetStream(nats.PublishAsyncMaxPending(inflight))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	mk := func(i int) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = body(fmt.Sprintf("far-%d", i), i, subject)
		m.Header.Set("Fluxon-Delay", delay)
		return m
	}
	t0 := time.Now()
	acked := 0
	var again []int // failed or unanswered: published again one at a time (a timed-out one may be stored twice)
	type fut struct {
		i int
		f nats.PubAckFuture
	}
	var futs []fut
	errs := map[string]int{}
	collect := func() {
		for _, x := range futs {
			select {
			case <-x.f.Ok():
				acked++
			case e := <-x.f.Err():
				errs[e.Error()]++
				again = append(again, x.i)
			}
		}
		futs = futs[:0]
	}
	for i := 0; i < n; i++ {
		f, err := js.PublishMsgAsync(mk(i))
		if err != nil {
			errs[err.Error()]++
			again = append(again, i)
			continue
		}
		futs = append(futs, fut{i, f})
		if len(futs) >= inflight {
			collect()
		}
	}
	collect()
	retried, failed := len(again), 0
	for _, i := range again {
		ok := false
		for try := 0; try < 10 && !ok; try++ {
			if _, err := js.PublishMsg(mk(i), nats.AckWait(10*time.Second)); err == nil {
				ok = true
			} else {
				errs[err.Error()]++
				time.Sleep(100 * time.Millisecond) // retry pacing
			}
		}
		if ok {
			acked++
		} else {
			failed++
		}
	}
	s := time.Since(t0).Seconds()
	json.NewEncoder(os.Stdout).Encode(map[string]interface{}{"acked": acked, "failed": failed, "retried": retried, "errors": errs, "seconds": s, "rate": float64(acked) / s})
	if failed > 0 {
		return 1
	}
	return 0
}
