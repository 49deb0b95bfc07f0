// Command franz produces through kdelay's proxy with franz-go (github.com/twmb/franz-go), the
// third client family of issue 36 point 1, and reads the records back from Kafka.
//
// What: it produces -count immediate records, then -delayed records carrying -delay-header
// (a kdelay timing header, for instance kdelay-delay-ms=1500) and a kdelay-id each, to one
// partition of -topic through -brokers, one ProduceSync per kind so each kind is a batch of its
// own (a mixed batch's answer carries the first immediate record's offset). With
// -consume-brokers it then reads that partition from the start, with the same security settings,
// until it has seen every record it produced or -timeout passes. With -repeat-for, before reading
// back, it keeps its connections busy, producing one record at a time, across SASL session
// lifetimes (KIP-368 re-authentication). It prints one JSON line: what each record was
// acknowledged with, what was read back and when, and the first error with franz-go's exact
// text and Kafka error code, besides the first failed connection and ERROR log line.
//
// Why: an unchanged producer configured for a secured cluster must work through the proxy by
// changing only the bootstrap servers; the Python tests (tests/integration/
// test_proxy_sasl_franz.py) drive this program and judge its output.
//
// Security: -mechanism is PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER (an unsecured JWT
// whose subject is -user, as Kafka's default unsecured validator accepts) or NONE. The password
// is read from the environment variable named by -password-env only, never from a flag. TLS is
// on when -ca-file is given (the CA that signed the listener's certificate).
//
// Concurrency: one goroutine drives everything; franz-go runs its own goroutines per broker and
// calls the observer's hook and logger from them (it takes a lock).
// The exit status is 0 whenever the JSON line was printed, failures included: the caller judges.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

type settings struct {
	brokers, consumeBrokers, mechanism, user, passwordEnv, caFile string
	topic, delayHeader, runID                                     string
	partition                                                     int
	count, delayed                                                int
	timeout, deliveryTimeout, repeatFor, repeatEvery              time.Duration
	ping                                                          bool
}

// produced is one record's acknowledgement.
type produced struct {
	Value     string `json:"value"`
	ID        string `json:"id,omitempty"`
	Delayed   bool   `json:"delayed"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	SentMs    int64  `json:"sent_ms"`
	Error     string `json:"error,omitempty"`
	Code      string `json:"code,omitempty"`
}

// consumed is one record read back.
type consumed struct {
	Value      string            `json:"value"`
	Partition  int32             `json:"partition"`
	Offset     int64             `json:"offset"`
	Headers    map[string]string `json:"headers"`
	ReceivedMs int64             `json:"received_ms"`
}

type result struct {
	Mechanism string     `json:"mechanism"`
	Produced  []produced `json:"produced"`
	Consumed  []consumed `json:"consumed"`
	// Error is the first error, franz-go's exact text; Code its Kafka error code, if any.
	Error     string `json:"error,omitempty"`
	Code      string `json:"code,omitempty"`
	Stage     string `json:"stage,omitempty"`
	ElapsedMs int64  `json:"elapsed_ms"`
	// Repeated counts the records of -repeat-for acknowledged, one at a time.
	Repeated int `json:"repeated"`
	// The first failed connection (OnBrokerConnect: dial, TLS, ApiVersions or SASL), its Kafka
	// error code and when it came; the first line franz-go logged at level ERROR.
	ConnectError     string `json:"connect_error,omitempty"`
	ConnectErrorCode string `json:"connect_error_code,omitempty"`
	ConnectErrorMs   int64  `json:"connect_error_ms,omitempty"`
	LoggedError      string `json:"logged_error,omitempty"`
}

// observer keeps the first failed connection and the first ERROR log line of a client.
type observer struct {
	start  time.Time
	mu     sync.Mutex
	err    error
	errAt  time.Duration
	logged string
}

func (o *observer) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil && o.err == nil {
		o.err, o.errAt = err, time.Since(o.start)
	}
}

func (o *observer) Level() kgo.LogLevel { return kgo.LogLevelError }

func (o *observer) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if level == kgo.LogLevelError && o.logged == "" {
		o.logged = strings.TrimSpace(fmt.Sprintln(append([]any{msg}, keyvals...)...))
	}
}

func (o *observer) report(out *result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil {
		out.ConnectError, out.ConnectErrorCode = o.err.Error(), code(o.err)
		out.ConnectErrorMs = o.errAt.Milliseconds()
	}
	out.LoggedError = o.logged
}

func main() {
	var s settings
	flag.StringVar(&s.brokers, "brokers", "", "bootstrap servers to produce to (host:port,...)")
	flag.StringVar(&s.consumeBrokers, "consume-brokers", "", "bootstrap servers to read back from (none: no read-back)")
	flag.StringVar(&s.mechanism, "mechanism", "SCRAM-SHA-512", "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or NONE")
	flag.StringVar(&s.user, "user", "", "SASL user name (OAUTHBEARER: the token's subject)")
	flag.StringVar(&s.passwordEnv, "password-env", "FRANZ_SASL_PASSWORD", "environment variable holding the SASL password")
	flag.StringVar(&s.caFile, "ca-file", "", "PEM CA for TLS (no TLS when empty)")
	flag.StringVar(&s.topic, "topic", "", "topic to produce to")
	flag.IntVar(&s.partition, "partition", 0, "partition to produce to")
	flag.IntVar(&s.count, "count", 1, "immediate records")
	flag.IntVar(&s.delayed, "delayed", 0, "delayed records (each with -delay-header and a kdelay-id)")
	flag.StringVar(&s.delayHeader, "delay-header", "kdelay-delay-ms=1000", "NAME=VALUE of the delayed records' timing header")
	flag.StringVar(&s.runID, "run-id", "", "prefix of values and ids (default: the time)")
	flag.DurationVar(&s.timeout, "timeout", 60*time.Second, "deadline of the whole run")
	flag.DurationVar(&s.deliveryTimeout, "delivery-timeout", 0, "kgo.RecordDeliveryTimeout (0: franz-go's default, unlimited)")
	flag.DurationVar(&s.repeatFor, "repeat-for", 0, "then produce one immediate record every -repeat-every for this long")
	flag.DurationVar(&s.repeatEvery, "repeat-every", 200*time.Millisecond, "the pace of -repeat-for")
	flag.BoolVar(&s.ping, "ping", false, "Ping (a Metadata request) before producing, reporting its error")
	flag.Parse()
	if s.runID == "" {
		s.runID = fmt.Sprintf("franz%d", time.Now().UnixNano())
	}
	out := run(s)
	line, err := json.Marshal(out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "franz: encoding the result:", err)
		os.Exit(2)
	}
	fmt.Println(string(line))
}

func run(s settings) (out result) {
	start := time.Now()
	out = result{Mechanism: s.mechanism, Produced: []produced{}, Consumed: []consumed{}}
	defer func() { out.ElapsedMs = time.Since(start).Milliseconds() }()
	fail := func(stage string, err error) result {
		out.Stage, out.Error, out.Code = stage, err.Error(), code(err)
		return out
	}
	if s.brokers == "" || s.topic == "" {
		return fail("settings", errors.New("-brokers and -topic are required"))
	}
	name, value, ok := strings.Cut(s.delayHeader, "=")
	if s.delayed > 0 && (!ok || name == "") {
		return fail("settings", fmt.Errorf("-delay-header %q: expected NAME=VALUE", s.delayHeader))
	}
	opts, err := security(s)
	if err != nil {
		return fail("settings", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()

	seen := &observer{start: start}
	defer seen.report(&out)
	producerOpts := append(slices.Clip(opts),
		kgo.SeedBrokers(strings.Split(s.brokers, ",")...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ClientID("kdelay-franz-test"),
		kgo.WithHooks(seen),
		kgo.WithLogger(seen),
	)
	if s.deliveryTimeout > 0 {
		producerOpts = append(producerOpts, kgo.RecordDeliveryTimeout(s.deliveryTimeout))
	}
	producer, err := kgo.NewClient(producerOpts...)
	if err != nil {
		return fail("client", err)
	}
	defer producer.Close()
	if s.ping {
		if err := producer.Ping(ctx); err != nil {
			return fail("ping", err)
		}
	}

	var now, later []*kgo.Record
	for i := range s.count {
		now = append(now, &kgo.Record{
			Topic: s.topic, Partition: int32(s.partition),
			Key: []byte("k"), Value: fmt.Appendf(nil, "%s-now-%d", s.runID, i),
		})
	}
	for i := range s.delayed {
		id := fmt.Sprintf("%s-later-%d", s.runID, i)
		later = append(later, &kgo.Record{
			Topic: s.topic, Partition: int32(s.partition), Key: []byte("k"), Value: []byte(id),
			Headers: []kgo.RecordHeader{{Key: name, Value: []byte(value)}, {Key: "kdelay-id", Value: []byte(id)}},
		})
	}
	for _, batch := range [][]*kgo.Record{now, later} {
		if len(batch) == 0 {
			continue
		}
		sent := time.Now().UnixMilli()
		results := producer.ProduceSync(ctx, batch...)
		for _, r := range results {
			p := produced{
				Value: string(r.Record.Value), Delayed: len(r.Record.Headers) > 0,
				Partition: r.Record.Partition, Offset: r.Record.Offset, SentMs: sent,
			}
			if p.Delayed {
				p.ID = p.Value
			}
			if r.Err != nil {
				p.Error, p.Code, p.Offset = r.Err.Error(), code(r.Err), -1
				if out.Error == "" {
					out.Stage, out.Error, out.Code = "produce", p.Error, p.Code
				}
			}
			out.Produced = append(out.Produced, p)
		}
	}
	if out.Error != "" {
		return out
	}
	// One record at a time for -repeat-for: a connection kept busy across SASL session
	// lifetimes (KIP-368 re-authentication).
	for until := time.Now().Add(s.repeatFor); time.Now().Before(until); time.Sleep(s.repeatEvery) {
		r := &kgo.Record{Topic: s.topic, Partition: int32(s.partition), Value: []byte("repeat")}
		if err := producer.ProduceSync(ctx, r).FirstErr(); err != nil {
			return fail("repeat", err)
		}
		out.Repeated++
	}
	if s.consumeBrokers == "" {
		return out
	}
	out.Consumed, err = readBack(ctx, s, opts)
	if err != nil {
		return fail("consume", err)
	}
	return out
}

// readBack reads -partition of -topic from its start until every produced value was seen.
func readBack(ctx context.Context, s settings, opts []kgo.Opt) ([]consumed, error) {
	want := map[string]bool{}
	for i := range s.count {
		want[fmt.Sprintf("%s-now-%d", s.runID, i)] = true
	}
	for i := range s.delayed {
		want[fmt.Sprintf("%s-later-%d", s.runID, i)] = true
	}
	consumer, err := kgo.NewClient(append(slices.Clip(opts),
		kgo.SeedBrokers(strings.Split(s.consumeBrokers, ",")...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
			s.topic: {int32(s.partition): kgo.NewOffset().AtStart()},
		}),
	)...)
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	got := []consumed{}
	for len(want) > 0 {
		fetches := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return got, fmt.Errorf("read back %d of %d records before the deadline: %w",
				len(got), len(got)+len(want), err)
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return got, errs[0].Err
		}
		received := time.Now().UnixMilli()
		fetches.EachRecord(func(r *kgo.Record) {
			headers := map[string]string{}
			for _, h := range r.Headers {
				headers[h.Key] = string(h.Value)
			}
			delete(want, string(r.Value))
			got = append(got, consumed{
				Value: string(r.Value), Partition: r.Partition, Offset: r.Offset,
				Headers: headers, ReceivedMs: received,
			})
		})
	}
	return got, nil
}

// security: the SASL mechanism and TLS options of -mechanism, -user, -password-env, -ca-file.
func security(s settings) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if s.caFile != "" {
		pem, err := os.ReadFile(s.caFile)
		if err != nil {
			return nil, fmt.Errorf("-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-ca-file %s: no PEM certificate in it", s.caFile)
		}
		opts = append(opts, kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	}
	password := os.Getenv(s.passwordEnv)
	needsPassword := s.mechanism != "NONE" && s.mechanism != "OAUTHBEARER"
	if needsPassword && password == "" {
		return nil, fmt.Errorf("-mechanism %s needs a password in the environment variable %s (-password-env)",
			s.mechanism, s.passwordEnv)
	}
	var mech sasl.Mechanism
	switch s.mechanism {
	case "NONE":
		return opts, nil
	case "PLAIN":
		mech = plain.Auth{User: s.user, Pass: password}.AsMechanism()
	case "SCRAM-SHA-256":
		mech = scram.Auth{User: s.user, Pass: password}.AsSha256Mechanism()
	case "SCRAM-SHA-512":
		mech = scram.Auth{User: s.user, Pass: password}.AsSha512Mechanism()
	case "OAUTHBEARER":
		mech = oauth.Auth{Token: unsecuredJWT(s.user)}.AsMechanism()
	default:
		return nil, fmt.Errorf("-mechanism %q: expected PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or NONE", s.mechanism)
	}
	return append(opts, kgo.SASL(mech)), nil
}

// unsecuredJWT is an unsigned token ("alg": "none") for Kafka's default OAUTHBEARER validator
// (OAuthBearerUnsecuredValidatorCallbackHandler), as librdkafka's
// enable.sasl.oauthbearer.unsecure.jwt makes one.
func unsecuredJWT(subject string) string {
	enc := base64.RawURLEncoding
	now := time.Now().Unix()
	claims, _ := json.Marshal(map[string]any{"sub": subject, "iat": now, "exp": now + 3600})
	return enc.EncodeToString([]byte(`{"alg":"none"}`)) + "." + enc.EncodeToString(claims) + "."
}

// code is the Kafka error code's name in err's chain ("" if none).
func code(err error) string {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Message
	}
	return ""
}
