// pull: nats.go (Debian golang-github-nats-io-go-nats-dev) pull consumers against fluxon-bridge.
// Run by tests/e2e/48_go_pull_consumer.test.mjs; built offline in GOPATH mode.
//
//	pull -url nats://... -channel orders -capture orders.gopull -dlq q.orders-dlq -consumer gopull
//
// Creates the durable pull consumer (ack_wait 2s, max_deliver 3) with js.AddConsumer, publishes
// 40 messages with js.Publish and consumes them with two workers, each js.PullSubscribe (bound
// to the durable) + Fetch(10) + Ack: every message exactly once across the two, none redelivered.
// Then one worker drives the ack helpers on five more messages: Nak (back at once, then acked),
// NakWithDelay(1.5s) (back no sooner), InProgress (kept past ack_wait, no redelivery), Term (dead
// letter, reason term) and a poison message always NAKed (delivered max_deliver = 3 times, then
// dead-lettered, never a 4th time). Dead letters are read from the dead-letter channel's claim.
// -domain D: the JetStream context uses nats.Domain(D) ($JS.D.API); -phase1: phase 1 only.
// Prints "FAIL: ..." per violated expectation and a RESULT JSON line; exit 0 only when all held.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

var failures []string
var fmu sync.Mutex

func fail(format string, a ...interface{}) {
	s := fmt.Sprintf(format, a...)
	fmu.Lock()
	failures = append(failures, s)
	fmu.Unlock()
	fmt.Println("FAIL: " + s)
}

type seen struct {
	at        time.Time
	delivered uint64
	worker    int
}

func main() {
	url := flag.String("url", "nats://127.0.0.1:4222", "NATS URL")
	channel := flag.String("channel", "orders", "channel (stream)")
	capture := flag.String("capture", "orders.gopull", "capture subject")
	dlqPrefix := flag.String("dlq", "q.orders-dlq", "deliver prefix of the dead-letter channel")
	consumer := flag.String("consumer", "gopull", "durable consumer")
	n := flag.Int("n", 40, "messages of the first phase")
	slowF := flag.Int("slow", 1, "slow-build factor")
	domain := flag.String("domain", "", "JetStream domain (nats.Domain): the bridge's jetstream.domain")
	phase1 := flag.Bool("phase1", false, "only phase 1 (then ConsumerInfo and the RESULT line)")
	flag.Parse()
	slow := time.Duration(*slowF)
	if slow < 1 {
		slow = 1
	}
	nc, err := nats.Connect(*url, nats.Name("go-pull"))
	if err != nil {
		fmt.Println("FAIL: connect:", err)
		os.Exit(1)
	}
	defer nc.Close()
	jsOpts := []nats.JSOpt{nats.MaxWait(5 * time.Second)}
	if *domain != "" {
		jsOpts = append(jsOpts, nats.Domain(*domain))
	}
	js, err := nc.JetStream(jsOpts...)
	if err != nil {
		fmt.Println("FAIL: JetStream context:", err)
		os.Exit(1)
	}
	ackWait := 2 * time.Second
	_, err = js.AddConsumer(*channel, &nats.ConsumerConfig{Durable: *consumer, AckPolicy: nats.AckExplicitPolicy,
		AckWait: ackWait, MaxDeliver: 3, MaxAckPending: 100})
	if err != nil {
		fmt.Println("FAIL: AddConsumer:", err)
		os.Exit(1)
	}
	dlq, err := nc.SubscribeSync(*dlqPrefix + "." + *consumer)
	if err != nil {
		fmt.Println("FAIL: subscribe dlq:", err)
		os.Exit(1)
	}
	for i := 0; i < *n; i++ {
		if _, err := js.Publish(*capture, []byte(fmt.Sprintf("m-%d", i))); err != nil {
			fail("publish m-%d: %v", i, err)
		}
	}

	// Phase 1: two workers, Fetch(10), each message once.
	subs := make([]*nats.Subscription, 2)
	for w := range subs {
		if subs[w], err = js.PullSubscribe("", *consumer, nats.Bind(*channel, *consumer)); err != nil {
			fmt.Println("FAIL: PullSubscribe:", err)
			os.Exit(1)
		}
	}
	var mu sync.Mutex
	got := map[string][]seen{}
	perWorker := make([]int, 2)
	unique := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }
	deadline := time.Now().Add(30 * time.Second * slow)
	var wg sync.WaitGroup
	for w := range subs {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for unique() < *n && time.Now().Before(deadline) {
				msgs, err := subs[w].Fetch(10, nats.MaxWait(time.Second))
				if err != nil && err != nats.ErrTimeout {
					fail("worker %d: Fetch: %v", w, err)
					time.Sleep(100 * time.Millisecond)
				}
				for _, m := range msgs {
					md, err := m.Metadata()
					if err != nil {
						fail("worker %d: Metadata: %v", w, err)
						continue
					}
					if md.Stream != *channel || md.Consumer != *consumer {
						fail("metadata stream/consumer %s/%s", md.Stream, md.Consumer)
					}
					mu.Lock()
					got[string(m.Data)] = append(got[string(m.Data)], seen{time.Now(), md.NumDelivered, w})
					perWorker[w]++
					mu.Unlock()
					if err := m.Ack(); err != nil {
						fail("worker %d: Ack: %v", w, err)
					}
				}
			}
		}(w)
	}
	wg.Wait()
	// Past ack_wait: nothing may come back.
	time.Sleep(ackWait + 500*time.Millisecond)
	for w := range subs {
		msgs, _ := subs[w].Fetch(10, nats.MaxWait(500*time.Millisecond))
		for _, m := range msgs {
			fail("worker %d: redelivered after ack: %s", w, string(m.Data))
		}
	}
	if len(got) != *n {
		fail("phase 1: %d of %d messages received", len(got), *n)
	}
	for id, s := range got {
		if len(s) != 1 {
			fail("phase 1: %s received %d times", id, len(s))
		}
	}
	fmt.Printf("phase 1: %d unique, per worker %v\n", len(got), perWorker)
	if perWorker[0] == 0 || perWorker[1] == 0 {
		fail("phase 1: both workers should be served (per worker %v)", perWorker)
	}

	if *phase1 {
		ci, err := js.ConsumerInfo(*channel, *consumer)
		if err != nil {
			fail("ConsumerInfo: %v", err)
		} else if ci.Stream != *channel || ci.Name != *consumer {
			fail("ConsumerInfo: %s/%s", ci.Stream, ci.Name)
		}
		out, _ := json.Marshal(map[string]interface{}{"failures": failures, "phase1_per_worker": perWorker})
		fmt.Println("RESULT " + string(out))
		if len(failures) > 0 {
			os.Exit(1)
		}
		return
	}

	// Phase 2: the ack helpers.
	for _, id := range []string{"nak", "nakd", "wpi", "term", "poison"} {
		if _, err := js.Publish(*capture, []byte(id)); err != nil {
			fail("publish %s: %v", id, err)
		}
	}
	hist := map[string][]seen{}
	done := map[string]bool{}
	dead := map[string]string{}
	var wpiDone chan struct{}
	sub := subs[0]
	end := time.Now().Add(40 * time.Second * slow)
	var quietFrom time.Time
	for time.Now().Before(end) {
		msgs, err := sub.Fetch(5, nats.MaxWait(500*time.Millisecond))
		if err != nil && err != nats.ErrTimeout {
			fail("phase 2: Fetch: %v", err)
		}
		for _, m := range msgs {
			md, _ := m.Metadata()
			id := string(m.Data)
			d := uint64(0)
			if md != nil {
				d = md.NumDelivered
			}
			hist[id] = append(hist[id], seen{time.Now(), d, 0})
			k := len(hist[id])
			switch id {
			case "nak":
				if k == 1 {
					m.Nak()
				} else {
					m.Ack()
					done[id] = true
				}
			case "nakd":
				if k == 1 {
					m.NakWithDelay(1500 * time.Millisecond)
				} else {
					m.Ack()
					done[id] = true
				}
			case "wpi":
				if k == 1 {
					wpiDone = make(chan struct{})
					go func(m *nats.Msg, ch chan struct{}) {
						for i := 0; i < 4; i++ { // 3.2 s in all, past ack_wait (2 s)
							m.InProgress()
							time.Sleep(800 * time.Millisecond)
						}
						m.Ack()
						close(ch)
					}(m, wpiDone)
				} else {
					m.Ack()
				}
			case "term":
				m.Term()
			case "poison":
				m.Nak()
			default:
				fail("phase 2: unexpected %s", id)
				m.Ack()
			}
		}
		for {
			dm, err := dlq.NextMsg(10 * time.Millisecond)
			if err != nil {
				break
			}
			dead[string(dm.Data)] = dm.Header.Get("Fluxon-Dead-Reason")
			dm.Respond(nil) // ack the dead letter
		}
		if wpiDone != nil {
			select {
			case <-wpiDone:
				done["wpi"] = true
			default:
			}
		}
		if done["nak"] && done["nakd"] && done["wpi"] && dead["term"] != "" && dead["poison"] != "" {
			if quietFrom.IsZero() {
				quietFrom = time.Now()
			} else if time.Since(quietFrom) > ackWait+500*time.Millisecond {
				break // quiet past ack_wait: nothing more comes
			}
		}
	}
	check := func(id string, want int) {
		if len(hist[id]) != want {
			fail("%s: %d deliveries, want %d", id, len(hist[id]), want)
		}
		for i, s := range hist[id] {
			if s.delivered != uint64(i+1) {
				fail("%s: delivery %d has NumDelivered %d", id, i+1, s.delivered)
			}
		}
	}
	check("nak", 2)
	check("nakd", 2)
	check("wpi", 1)
	check("term", 1)
	check("poison", 3)
	if len(hist["nakd"]) == 2 {
		if gap := hist["nakd"][1].at.Sub(hist["nakd"][0].at); gap < 1300*time.Millisecond {
			fail("nakd: back after %v, before its 1.5s delay", gap)
		}
	}
	if !done["wpi"] {
		fail("wpi: not acked")
	}
	if dead["term"] != "term" {
		fail("term: dead-letter reason %q", dead["term"])
	}
	if !strings.Contains(dead["poison"], "max_deliver") {
		fail("poison: dead-letter reason %q", dead["poison"])
	}
	ci, err := js.ConsumerInfo(*channel, *consumer)
	if err != nil {
		fail("ConsumerInfo: %v", err)
	} else if ci.NumPending != 0 {
		fail("ConsumerInfo: num_pending %d after everything was acked", ci.NumPending)
	}
	out, _ := json.Marshal(map[string]interface{}{"failures": failures, "phase1_per_worker": perWorker,
		"dead": dead, "deliveries": map[string]int{"nak": len(hist["nak"]), "nakd": len(hist["nakd"]),
			"wpi": len(hist["wpi"]), "term": len(hist["term"]), "poison": len(hist["poison"])}})
	fmt.Println("RESULT " + string(out))
	if len(failures) > 0 {
		os.Exit(1)
	}
}
