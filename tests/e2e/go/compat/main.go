// compat: the nats.go client (Debian golang-github-nats-io-go-nats-dev) against fluxon-bridge.
// Run by tests/e2e/14_go_client_compat.test.mjs; built offline in GOPATH mode from
// /usr/share/gocode (no module download).
//
//	compat -url nats://... -channel orders -capture orders.go -deliver q.orders -claim gocli
//
// Publishes six messages with js.Publish, consumes them as claim <claim> with a plain
// subscription and drives every JetStream ack helper: Ack, AckSync, Nak, NakWithDelay,
// InProgress, Term. Checks the PubAcks, the Metadata() of every delivery (stream, consumer,
// delivered count, stream sequence = PubAck sequence, timestamp within 1 s of the publish) and
// the delivery history (acked messages are not redelivered, NAKed ones come back once, the
// terminated one reaches the dead-letter channel). Prints one "FAIL: ..." line per violated
// expectation and a JSON summary; exits 0 only when every expectation held.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

var failures []string

func fail(format string, a ...interface{}) {
	s := fmt.Sprintf(format, a...)
	failures = append(failures, s)
	fmt.Println("FAIL: " + s)
}

type delivery struct {
	Kind      string `json:"kind"`
	Delivered uint64 `json:"delivered"`
	Stream    string `json:"stream"`
	Consumer  string `json:"consumer"`
	Seq       uint64 `json:"seq"`
	TsSkewMs  int64  `json:"ts_skew_ms"` // metadata timestamp - publish time
	AtMs      int64  `json:"at_ms"`      // since the publish
	AckMs     int64  `json:"ack_ms"`     // duration of the ack call (AckSync)
}

func main() {
	url := flag.String("url", "nats://127.0.0.1:4222", "NATS URL")
	channel := flag.String("channel", "orders", "channel (stream) name")
	capture := flag.String("capture", "orders.go", "capture subject prefix")
	deliver := flag.String("deliver", "q.orders", "delivery prefix")
	claim := flag.String("claim", "gocli", "claim (consumer) name")
	ackWait := flag.Duration("ack-wait", 2*time.Second, "the bridge's ack_wait")
	slowF := flag.Int("slow", 1, "slow-build factor (FXT_SLOW): multiplies the AckSync wait, the timestamp skew bound and the overall deadline")
	flag.Parse()
	slow := time.Duration(*slowF)
	if slow < 1 {
		slow = 1
	}

	nc, err := nats.Connect(*url, nats.Name("go-compat"))
	if err != nil {
		fmt.Println("FAIL: connect:", err)
		os.Exit(1)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		fmt.Println("FAIL: JetStream context:", err)
		os.Exit(1)
	}
	sub, err := nc.SubscribeSync(*deliver + "." + *claim)
	if err != nil {
		fmt.Println("FAIL: subscribe:", err)
		os.Exit(1)
	}
	dlq, err := nc.SubscribeSync(*deliver + "-dlq." + *claim)
	if err != nil {
		fmt.Println("FAIL: subscribe dlq:", err)
		os.Exit(1)
	}
	nc.Flush()

	// What each message exercises, in publish order.
	kinds := []string{"ack", "acksync", "nak", "nakdelay", "wpi", "term"}
	pubTime := map[string]time.Time{}
	pubSeq := map[string]uint64{}
	for _, k := range kinds {
		t0 := time.Now()
		pa, err := js.Publish(*capture+"."+k, []byte(k), nats.AckWait(5*time.Second))
		if err != nil {
			fail("js.Publish %s: %v", k, err)
			continue
		}
		pubTime[k] = t0
		pubSeq[k] = pa.Sequence
		if pa.Stream != *channel {
			fail("PubAck of %s: stream %q, want %q", k, pa.Stream, *channel)
		}
		if pa.Sequence == 0 {
			fail("PubAck of %s: sequence 0", k)
		}
		if pa.Duplicate {
			fail("PubAck of %s: duplicate true", k)
		}
	}
	if len(pubSeq) != len(kinds) {
		report(nil)
	}

	var hist []delivery
	count := map[string]int{}
	var wpiStart time.Time
	wpiAcked := false
	nakDelay := 1500 * time.Millisecond
	// Expected: ack 1, acksync 1, nak 2, nakdelay 2, wpi 1 (kept alive past ack_wait with
	// InProgress), term 1. Stop once all came and a quiet period (> ack_wait) shows no more.
	deadline := time.Now().Add(30 * time.Second * slow)
	quietUntil := time.Time{}
	for time.Now().Before(deadline) {
		if wpiStart.IsZero() == false && !wpiAcked {
			// InProgress every ack_wait/2, ack after 1.5 x ack_wait: no redelivery may happen.
			el := time.Since(wpiStart)
			if el > *ackWait*3/2 {
				wpiAcked = true
				wpiMsg.Ack()
			} else if el > time.Duration(wpiBeats+1)**ackWait/2 {
				wpiBeats++
				if err := wpiMsg.InProgress(); err != nil {
					fail("InProgress: %v", err)
				}
			}
		}
		m, err := sub.NextMsg(100 * time.Millisecond)
		if err == nats.ErrTimeout {
			done := count["ack"] >= 1 && count["acksync"] >= 1 && count["nak"] >= 2 &&
				count["nakdelay"] >= 2 && wpiAcked && count["term"] >= 1
			if done && quietUntil.IsZero() {
				quietUntil = time.Now().Add(*ackWait + 500*time.Millisecond)
			}
			if done && time.Now().After(quietUntil) {
				break
			}
			continue
		}
		if err != nil {
			fail("NextMsg: %v", err)
			break
		}
		k := string(m.Data)
		count[k]++
		md, err := m.Metadata()
		if err != nil {
			fail("Metadata() of %s (reply %q): %v", k, m.Reply, err)
			continue
		}
		d := delivery{Kind: k, Delivered: md.NumDelivered, Stream: md.Stream, Consumer: md.Consumer,
			Seq: md.Sequence.Stream, TsSkewMs: md.Timestamp.Sub(pubTime[k]).Milliseconds(),
			AtMs: time.Since(pubTime[k]).Milliseconds()}
		if md.Stream != *channel {
			fail("Metadata of %s: stream %q", k, md.Stream)
		}
		if md.Consumer != *claim {
			fail("Metadata of %s: consumer %q", k, md.Consumer)
		}
		if md.NumDelivered != uint64(count[k]) {
			fail("Metadata of %s: delivered %d, want %d", k, md.NumDelivered, count[k])
		}
		if md.Sequence.Stream != pubSeq[k] {
			fail("Metadata of %s: stream seq %d, PubAck seq %d", k, md.Sequence.Stream, pubSeq[k])
		}
		if md.Sequence.Consumer == 0 {
			fail("Metadata of %s: consumer seq 0", k)
		}
		if skew := md.Timestamp.Sub(pubTime[k]); skew < -time.Second*slow || skew > time.Second*slow {
			fail("Metadata of %s (delivery %d): timestamp %v is %v from the publish time",
				k, md.NumDelivered, md.Timestamp, skew)
		}
		switch {
		case k == "ack":
			err = m.Ack()
		case k == "acksync" || (k == "nak" && count[k] == 2):
			t0 := time.Now()
			err = m.AckSync(nats.AckWait(time.Second * slow))
			d.AckMs = time.Since(t0).Milliseconds()
			if err != nil {
				fail("AckSync of %s: %v after %d ms", k, err, d.AckMs)
			}
		case k == "nak" && count[k] == 1:
			err = m.Nak()
		case k == "nakdelay" && count[k] == 1:
			err = m.NakWithDelay(nakDelay)
		case k == "nakdelay":
			// JetStream: redelivered no sooner than the delay asked for
			prev := hist[lastIndex(hist, "nakdelay")]
			if gap := d.AtMs - prev.AtMs; gap < nakDelay.Milliseconds()-100 {
				fail("NakWithDelay(%v): redelivered after %d ms", nakDelay, gap)
			}
			err = m.Ack()
		case k == "wpi" && count[k] == 1:
			wpiStart = time.Now()
			wpiMsg = m
			err = m.InProgress()
		case k == "term" && count[k] == 1:
			err = m.Term()
		default:
			fail("unexpected delivery %d of %s", count[k], k)
			err = m.Ack()
		}
		if err != nil {
			fail("ack call for %s (delivery %d): %v", k, count[k], err)
		}
		hist = append(hist, d)
	}
	want := map[string]int{"ack": 1, "acksync": 1, "nak": 2, "nakdelay": 2, "wpi": 1, "term": 1}
	for k, n := range want {
		if count[k] != n {
			fail("%s delivered %d time(s), want %d", k, count[k], n)
		}
	}
	// The terminated message is on the dead-letter channel, with its reason.
	if m, err := dlq.NextMsg(10 * time.Second); err != nil {
		fail("dead letter of term: %v", err)
	} else {
		if string(m.Data) != "term" {
			fail("dead letter body %q", string(m.Data))
		}
		if r := m.Header.Get("Fluxon-Dead-Reason"); !strings.HasPrefix(r, "term") {
			fail("dead letter reason %q", r)
		}
		if md, err := m.Metadata(); err != nil || md.Stream != *channel+"-dlq" {
			fail("dead letter metadata: %v %v", md, err)
		}
		m.AckSync(nats.AckWait(time.Second * slow))
	}
	report(hist)
}

var wpiMsg *nats.Msg
var wpiBeats int

func lastIndex(h []delivery, kind string) int {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Kind == kind {
			return i
		}
	}
	return 0
}

func report(hist []delivery) {
	b, _ := json.Marshal(map[string]interface{}{"deliveries": hist, "failures": failures})
	fmt.Println("RESULT " + string(b))
	if len(failures) > 0 {
		os.Exit(1)
	}
	os.Exit(0)
}
