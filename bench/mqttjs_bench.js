// The MQTT.js side of bench/bench_driver.py: N clients in one Node process, publishing
// as fast as the socket takes it (QoS 0), keeping `inflight` QoS 1 messages outstanding,
// or subscribing; counts what happened inside the measure window.
//
//   node bench/mqttjs_bench.js '{"port":1883,"mode":"pub","clients":100,"qos":0,...}'
//
// Prints "READY" once every client is connected (and subscribed), then reads one JSON
// line from stdin: {"start":..,"measure_start":..,"measure_end":..,"end":..} (Unix s),
// runs, prints {"count": N, "errors": E} and exits. Connects are paced (at most
// `pending` CONNECTs awaiting CONNACK) like perfpipe's, so neither tool pays for
// overflowing the broker's listen backlog.
'use strict';
const mqtt = require('mqtt');
const readline = require('readline');

const cfg = JSON.parse(process.argv[2]);
const HIGH = 64 * 1024; // bytes queued on a socket before a publisher waits for 'drain'
const BATCH = 512; // publishes per client per turn of the event loop
const clients = [];
let errors = 0;
let count = 0;
let running = false; // publishing
let counting = false; // inside the measure window (set by timers: no clock read per message)

function connectAll(done) {
  let next = 0;
  let pending = 0;
  let ready = 0;
  const limit = cfg.pending || 64;
  function openMore() {
    while (next < cfg.clients && pending < limit) {
      const i = next++;
      pending++;
      const c = mqtt.connect({
        host: '127.0.0.1', port: cfg.port, protocolVersion: 4, clean: true,
        keepalive: 60, reconnectPeriod: 0, clientId: `${cfg.prefix}-${i}`,
      });
      c.index = i;
      c.inflight = 0;
      c.on('error', () => { errors++; });
      c.once('connect', () => {
        pending--;
        // Node leaves Nagle on: with it a small publish waits for the ACK of the last one
        // and leaves in one segment with the next (up to ~40 ms later); --js-nodelay turns
        // it off, as perfpipe does (its latencies must not include that wait)
        if (cfg.nodelay) c.stream.setNoDelay(true);
        const finish = () => { ready++; if (ready === cfg.clients) done(); else openMore(); };
        if (cfg.mode === 'sub') {
          c.subscribe(cfg.topic, { qos: cfg.qos }, finish);
        } else {
          finish();
        }
      });
      clients.push(c);
    }
  }
  openMore();
}

// The leanest use of MQTT.js we could write, so the ratio is not flattered: one shared
// payload (no per-message header), no clock read per message, batches per event-loop turn.
const payload = Buffer.alloc(cfg.payload || 256);
const QOS0 = { qos: 0 };
const QOS1 = { qos: 1 };

function pump0(c) {
  if (!running) return;
  const s = c.stream;
  let n = 0;
  while (n < BATCH && s.writableLength < HIGH) {
    c.publish(c.topic, payload, QOS0);
    n++;
  }
  if (counting) count += n;
  if (s.writableLength >= HIGH) {
    s.once('drain', () => pump0(c));
  } else {
    setImmediate(pump0, c);
  }
}

function pump1(c) {
  if (!running) return;
  const s = c.stream;
  while (c.inflight < cfg.inflight && s.writableLength < HIGH) {
    c.inflight++;
    c.publish(c.topic, payload, QOS1, c.onAck);
  }
  if (s.writableLength >= HIGH && !c.waiting) {
    c.waiting = true;
    s.once('drain', () => { c.waiting = false; pump1(c); });
  }
}

// Rated mode (cfg.rate msgs/s per client): every TICK ms each client publishes the
// messages due by now, as a Node load tool does with a timer. Each client's schedule is
// offset by its own phase (golden-ratio spread, as perfpipe's publishers are): without it
// every client's message falls due on the same tick, and at 5 msgs/s x 10,000 clients the
// broker gets bursts of 10,000 messages five times a second, which it serves far more
// cheaply per message than a steady load (and which no real fleet of clients sends).
const TICK = cfg.tick_ms; // ms: bench_driver.py passes its JS_TICK_US
const GOLDEN = 0.6180339887498949;

// Send lateness (how long after its due time each message went out), in 10 us buckets,
// for the messages sent inside the measure window: the bench prints it beside perfpipe's
// pub_delay, so the two tools are compared at the send precision each delivers.
const LATE_BUCKET_US = 10;
const late = new Uint32Array(100001); // up to 1 s
const clock = () => performance.timeOrigin + performance.now(); // ms, sub-ms resolution

function startRated(startMs) {
  for (const c of clients) { c.phase = (c.index * GOLDEN) % 1; }
  const timer = setInterval(() => {
    if (!running) { clearInterval(timer); return; }
    const elapsed = (clock() - startMs) / 1000;
    let n = 0;
    for (const c of clients) {
      const due = Math.floor(elapsed * cfg.rate + c.phase);
      while (c.sent < due) {
        c.publish(c.topic, payload, QOS0);
        c.sent++;
        n++;
        if (counting) {  // message c.sent was due at (c.sent - phase) / rate
          const us = (elapsed - (c.sent - c.phase) / cfg.rate) * 1e6;
          late[Math.min(late.length - 1, Math.max(0, Math.floor(us / LATE_BUCKET_US)))]++;
        }
      }
    }
    if (counting) count += n;
  }, TICK);
}

function lateness() {
  let total = 0;
  for (const v of late) total += v;
  if (!total) return null;
  const at = (q) => {
    let acc = 0;
    for (let i = 0; i < late.length; i++) {
      acc += late[i];
      if (acc >= q * total) return (i + 0.5) * LATE_BUCKET_US;
    }
    return null;
  };
  return { p50: at(0.5), p90: at(0.9), p99: at(0.99) };
}

function startPublishing() {
  if (cfg.rate) {
    for (const c of clients) { c.topic = `${cfg.topic}/${c.index}`; c.sent = 0; }
    startRated(clock());
    return;
  }
  for (const c of clients) {
    c.topic = `${cfg.topic}/${c.index}`;
    if (cfg.qos === 0) {
      pump0(c);
    } else {
      c.onAck = (err) => {
        c.inflight--;
        if (err) { errors++; } else if (counting) { count++; }
        if (!c.scheduled) {
          c.scheduled = true;
          setImmediate(() => { c.scheduled = false; pump1(c); });
        }
      };
      pump1(c);
    }
  }
}

function onMessage() {
  if (counting) count++;
}

connectAll(() => {
  if (cfg.mode === 'sub') {
    for (const c of clients) c.on('message', onMessage);
  }
  process.stdout.write('READY\n');
  const rl = readline.createInterface({ input: process.stdin });
  rl.once('line', (line) => {
    const win = JSON.parse(line);
    const ms = (t) => Math.max(0, t * 1000 - Date.now());
    setTimeout(() => { counting = true; }, ms(win.measure_start));
    setTimeout(() => { counting = false; running = false; }, ms(win.measure_end));
    if (cfg.mode === 'pub') {
      setTimeout(() => { running = true; startPublishing(); }, ms(win.start));
    }
    setTimeout(() => {
      running = false;
      process.stdout.write(JSON.stringify({ count, errors, late_us: lateness() }) + '\n');
      for (const c of clients) c.end(true);
      rl.close();
      setTimeout(() => process.exit(0), 200);
    }, ms(win.end));
  });
});
