//! A flood of GPU fault events (issue 31): what judging them costs, and that the cost is bounded.
//!
//! 1. Reading one rendered `Display` 4101 record (`fault_from_xml`): how many events a second one
//!    core can read.
//! 2. Rebuilding the inventory (`dxdp::inventory::build_at`: discovery, then the recorded events
//!    judged under the default policy) on the sample host (three NVIDIA GPUs) with 0, 1,000,
//!    4,096 and 60,000 recorded resets: 60,000 is a minute of a 1,000 events/s flood. Only the
//!    newest `MAX_JUDGED_FAULTS` (4,096) are judged, so the cost stops growing there.
//!
//! 3. A flood through the live path (`health::faults`): 1,000 `Display` 4101 records a second
//!    for 60 seconds, each pushed into the subscription's bounded queue (what the event log's
//!    delivery thread does), drained into the kept fault log (parsed, deduplicated by
//!    `EventRecordID`), and once a second (the pacer's bound) the inventory rebuilt from the
//!    kept log. Reported: CPU time per event without and with the rebuilds, the share of one
//!    core the flood costs, and the peak memory of the queue and of the log (bytes of XML they
//!    hold; their bounds make it the same for a longer flood).
//!
//! Allocate is not on this path: it answers from the published inventory (an `Arc`), and the
//! refresher builds the next one on its own task; a rebuild's time is how late a health change
//! is, never how late an Allocate is.
//!
//! Each figure is the median of 7 rounds of about `DXDP_BENCH_MILLIS` (default 1000) ms. Run
//! with `cargo bench --bench health`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dxdp::backend::eventlog::{Delivery, Queue};
use dxdp::config::Config;
use dxdp::inventory::build_at;
use dxdp_core::facts::{HostFacts, LogRecord};
use dxdp_core::health::eventlog::fault_from_xml;
use dxdp_core::health::feed::{FaultLog, Offer};

/// A rendered 4101 record at `ms` milliseconds after 2026-11-25T00:00:00Z.
fn record(ms: u64) -> String {
    let (s, frac) = (ms / 1000, ms % 1000);
    format!(
        "<Event xmlns='http://schemas.microsoft.com/win/2004/08/events/event'><System><Provider Name='Display'/><EventID Qualifiers='0'>4101</EventID><Version>0</Version><Level>3</Level><Task>0</Task><Opcode>0</Opcode><Keywords>0x80000000000000</Keywords><TimeCreated SystemTime='2026-11-25T{:02}:{:02}:{:02}.{frac:03}0000Z'/><EventRecordID>{}</EventRecordID><Correlation/><Execution ProcessID='0' ThreadID='0'/><Channel>System</Channel><Computer>gpu-node-1</Computer><Security/></System><EventData><Data>nvlddmkm</Data><Data></Data></EventData></Event>",
        s / 3600 % 24,
        s / 60 % 60,
        s % 60,
        18_000 + ms
    )
}

fn budget() -> Duration {
    let ms = std::env::var("DXDP_BENCH_MILLIS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000u64);
    Duration::from_millis(ms)
}

/// The median over 7 rounds of the time per call of `f`.
fn time_per_call(budget: Duration, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    f();
    let one = start.elapsed().max(Duration::from_nanos(50));
    let n = ((budget.as_nanos() / 7) / one.as_nanos()).clamp(1, 1_000_000) as u32;
    let mut rounds: Vec<Duration> = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed() / n
        })
        .collect();
    rounds.sort();
    rounds[3]
}

fn main() {
    let budget = budget();
    let xml = record(21 * 3_600_000);
    let t = time_per_call(budget, || {
        black_box(fault_from_xml(black_box(&xml)).unwrap());
    });
    println!(
        "read one Display 4101 record: {:.2} us ({:.0} records/s on one core)",
        t.as_secs_f64() * 1e6,
        1.0 / t.as_secs_f64()
    );
    let sample = dxdp_core::sample::sample_host().expect("sample host");
    let config = Arc::new(Config::default());
    // The flood ends at 21:01:00; judged then.
    let end = 21 * 3_600_000 + 60_000;
    let now = 1_795_564_800_000 + end;
    println!("{:>9} {:>14} {:>16}", "recorded", "rebuild", "per record");
    for n in [0u64, 1_000, 4_096, 60_000] {
        let facts = HostFacts {
            faults: (0..n)
                .map(|i| LogRecord {
                    xml: record(end - n + i),
                })
                .collect(),
            ..sample.clone()
        };
        let t = time_per_call(budget, || {
            black_box(build_at(&facts, config.clone(), now));
        });
        let per = if n == 0 {
            "-".to_string()
        } else {
            format!("{:.2} us", t.as_secs_f64() * 1e6 / n as f64)
        };
        println!("{n:>9} {:>11.2} ms {per:>16}", t.as_secs_f64() * 1e3);
    }
    flood(&sample, &config);
}

/// Section 3: 60 s of a 1,000 events/s flood through the queue, the log and the paced rebuild.
fn flood(sample: &HostFacts, config: &Arc<Config>) {
    const SECONDS: u64 = 60;
    const RATE: u64 = 1_000;
    let start = 21 * 3_600_000;
    let now0 = 1_795_564_800_000 + start;
    // Rendered beforehand: EvtRender's work happens on Windows' side of the shim.
    let records: Vec<Vec<String>> = (0..SECONDS)
        .map(|s| (0..RATE).map(|i| record(start + s * 1000 + i)).collect())
        .collect();
    let queue = Queue::bounded();
    let mut log = FaultLog::default();
    let mut peak_queue = 0usize;
    let mut peak_log = 0usize;
    let (mut intake, mut rebuilds) = (Duration::ZERO, Duration::ZERO);
    let mut added = 0u64;
    for (s, second) in records.into_iter().enumerate() {
        let t = Instant::now();
        for xml in second {
            queue.push(Delivery::Event(xml));
        }
        peak_queue = peak_queue.max(queue.bytes());
        let now = now0 + s as u64 * 1000 + 999;
        let oldest = now.saturating_sub(20 * 60_000);
        for d in queue.drain() {
            if let Delivery::Event(xml) = d {
                if log.offer(xml, oldest) == Offer::Added {
                    added += 1;
                }
            }
        }
        intake += t.elapsed();
        peak_log = peak_log.max(log.bytes());
        // Once a second: the refresher rebuilds with the kept records.
        let t = Instant::now();
        let facts = HostFacts {
            faults: log.records(),
            ..sample.clone()
        };
        black_box(build_at(&facts, config.clone(), now));
        rebuilds += t.elapsed();
    }
    let events = SECONDS * RATE;
    assert_eq!(added, events, "every record of the flood is new");
    assert_eq!(queue.take_dropped(), 0, "1,000 a second fit the queue");
    let per = |d: Duration| d.as_secs_f64() * 1e6 / events as f64;
    println!(
        "flood of {RATE} events/s for {SECONDS} s: intake {:.2} us/event, with the rebuilds {:.2} us/event; {:.1} % of one core; rebuild {:.2} ms/s",
        per(intake),
        per(intake + rebuilds),
        (intake + rebuilds).as_secs_f64() * 100.0 / SECONDS as f64,
        rebuilds.as_secs_f64() * 1e3 / SECONDS as f64,
    );
    println!(
        "peak memory: queue {:.0} KiB ({} records at most {} KiB), kept log {:.0} KiB ({} records)",
        peak_queue as f64 / 1024.0,
        dxdp::backend::eventlog::QUEUE_CAPACITY,
        dxdp::backend::eventlog::QUEUE_BYTES >> 10,
        peak_log as f64 / 1024.0,
        log.len()
    );
    // Past the bound: 3,000 records in one go keep 1,024, the rest is dropped and counted.
    let q = Queue::bounded();
    let burst: Vec<String> = (0..3_000).map(|i| record(start + i)).collect();
    let t = Instant::now();
    for xml in burst {
        q.push(Delivery::Event(xml));
    }
    let pushed = t.elapsed();
    println!(
        "3,000 records at once: {} queued, {} dropped, {:.2} us/push",
        q.len(),
        q.take_dropped(),
        pushed.as_secs_f64() * 1e6 / 3000.0
    );
}
