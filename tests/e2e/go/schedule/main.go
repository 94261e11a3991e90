// schedule: delayed publishes from the nats.go client (Debian golang-github-nats-io-go-nats-dev).
// Run by tests/e2e/53_schedule_header_compat.test.mjs (compat mode) and
// tests/e2e/55_delayed_scale.test.mjs (flood mode); built offline in GOPATH mode.
//
//	schedule -url nats://... -subject orders.go -n 50 -first 1000 -spread 2000
//	    js.PublishMsg of n messages on ONE subject, each with "Nats-Schedule: @at <RFC 3339>"
//	    (first + i*spread/n ms from its send time), then the refused forms; prints one JSON line
//	    per publish: {"id","due_ms","ok","err","code"}.
//	schedule -flood -url ... -subject orders.far -n 1000000 -inflight 4096 -delay 24h
//	    n publishes with "Fluxon-Delay: <delay>", at most inflight PubAcks outstanding (one
//	    reply subject per message, see runFlood); prints {"acked","failed","retried",
//	    "unanswered","errors","seconds","rate"}.
//
// Message bodies follow tests/e2e/lib/client.mjs makeMsg: {"id","n","subject"} "\n" tail(n).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
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

// runFlood publishes n delayed messages with at most inflight PubAcks outstanding. It speaks
// JetStream's publish protocol directly (a publish with a reply subject, a PubAck JSON back)
// with one reply subject per message, _INBOX.<nuid>.<i>: nats.go 1.22's PublishMsgAsync draws a
// 6-character random reply token per publish (62^6 values) and keys its futures by it, so with
// 4,096 outstanding over 1,000,000 publishes two of them share a token in about 7% of runs and
// the first future never resolves (a hang with no timeout). Here a reply that never comes is
// the bridge's: after answerWait it counts as unanswered (reported, and published again one at
// a time; the test fails on any).
func runFlood(nc *nats.Conn, subject string, n, inflight int, delay string) int {
	const answerWait = 60 * time.Second
	mk := func(i int) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = body(fmt.Sprintf("far-%d", i), i, subject)
		m.Header.Set("Fluxon-Delay", delay)
		return m
	}
	prefix := nats.NewInbox() + "."
	type reply struct {
		i   int
		err string // "" for a PubAck
	}
	replies := make(chan reply, inflight+64)
	sub, err := nc.Subscribe(prefix+"*", func(m *nats.Msg) {
		i, e := strconv.Atoi(m.Subject[len(prefix):])
		if e != nil {
			return
		}
		var pa struct {
			Stream string `json:"stream"`
			Error  *struct {
				Code        int    `json:"code"`
				Description string `json:"description"`
			} `json:"error"`
		}
		r := reply{i: i}
		if len(m.Data) == 0 {
			r.err = "empty reply (no responders)"
		} else if json.Unmarshal(m.Data, &pa) != nil {
			r.err = "invalid PubAck JSON"
		} else if pa.Error != nil {
			r.err = fmt.Sprintf("%d %s", pa.Error.Code, pa.Error.Description)
		} else if pa.Stream == "" {
			r.err = "PubAck without a stream"
		}
		replies <- r
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	sub.SetPendingLimits(-1, -1)
	t0 := time.Now()
	acked := 0
	var again []int // refused or unanswered: published again one at a time (a late one may be stored twice)
	errs := map[string]int{}
	sent := make(map[int]time.Time, inflight)
	var unanswered []int
	handle := func(r reply) {
		if _, ok := sent[r.i]; !ok {
			return // late, after it counted as unanswered
		}
		delete(sent, r.i)
		if r.err == "" {
			acked++
		} else {
			errs[r.err]++
			again = append(again, r.i)
		}
	}
	issued := 0
	lastReport := time.Now()
	expire := func() { // the oldest first: a map walk is cheap next to answerWait
		now := time.Now()
		for i, at := range sent {
			if now.Sub(at) > answerWait {
				delete(sent, i)
				unanswered = append(unanswered, i)
				again = append(again, i)
			}
		}
		if now.Sub(lastReport) > 10*time.Second {
			lastReport = now
			fmt.Fprintf(os.Stderr, "flood: %.0f s: sent %d of %d, acked %d, outstanding %d, unanswered %d\n",
				now.Sub(t0).Seconds(), issued, n, acked, len(sent), len(unanswered))
		}
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	wait := func() { // one reply, or a tick
		select {
		case r := <-replies:
			handle(r)
		case <-tick.C:
			expire()
		}
	}
	for i := 0; i < n; i++ {
		for len(sent) >= inflight {
			wait()
		}
		m := mk(i)
		m.Reply = prefix + strconv.Itoa(i)
		issued++
		sent[i] = time.Now()
		if err := nc.PublishMsg(m); err != nil {
			delete(sent, i)
			errs[err.Error()]++
			again = append(again, i)
		}
	}
	for len(sent) > 0 {
		wait()
	}
	sub.Unsubscribe()
	retried, failed := len(again), 0
	for _, i := range again {
		ok := false
		for try := 0; try < 10 && !ok; try++ {
			r, err := nc.RequestMsg(mk(i), 10*time.Second)
			if err == nil {
				var pa struct {
					Stream string          `json:"stream"`
					Error  json.RawMessage `json:"error"`
				}
				if json.Unmarshal(r.Data, &pa) == nil && pa.Stream != "" && pa.Error == nil {
					ok = true
					break
				}
				err = fmt.Errorf("refused: %s", r.Data)
			}
			errs[err.Error()]++
			time.Sleep(100 * time.Millisecond) // retry pacing
		}
		if ok {
			acked++
		} else {
			failed++
		}
	}
	s := time.Since(t0).Seconds()
	json.NewEncoder(os.Stdout).Encode(map[string]interface{}{"acked": acked, "failed": failed, "retried": retried, "unanswered": len(unanswered), "unanswered_ids": firstK(unanswered, 10), "errors": errs, "seconds": s, "rate": float64(acked) / s})
	if failed > 0 {
		return 1
	}
	return 0
}

func firstK(v []int, k int) []int {
	if len(v) > k {
		return v[:k]
	}
	return v
}
