//! How the discovery pipeline and the ListAndWatch message grow with the size of the host.
//!
//! 1. `discover` on hosts of 1, 16 and 64 GPUs built from the sample host's NVIDIA A10: each GPU
//!    has its own driver key with the driver's real `CopyToVmOverwrite` and
//!    `CopyToVmOverwriteWow64` entries (12 values), the files present in the driver store as on the
//!    sample host.
//! 2. The ListAndWatch message for 16 GPUs with 1, 16 and 64 replicas: the device list built from
//!    the discovery and encoded as protobuf, as the daemon sends it.
//!
//! Each size is timed over enough repetitions to take about `DXDP_BENCH_MILLIS` (default 1000) ms;
//! the figure is the median of 7 such rounds. Linear growth shows as a per-item cost that stays
//! flat, and a growth ratio `cost(n) / (n * cost(1))` near 1. Run with
//! `cargo bench --bench pipeline`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use dxdp::kubelet::v1beta1::ListAndWatchResponse;
use dxdp::plugin::service::device_list;
use dxdp_core::devices::Resource;
use dxdp_core::facts::{HostFacts, RegistryKey};
use dxdp_core::pipeline::{discover, PipelineConfig};
use dxdp_core::sharing::Sharing;
use prost::Message;

const CLASS: &str =
    r"HKLM\SYSTEM\CurrentControlSet\Control\Class\{4d36e968-e325-11ce-bfc1-08002be10318}";

/// A host of `gpus` NVIDIA A10s, each with its own location path, LUID and driver key.
fn host(gpus: usize) -> HostFacts {
    let sample = dxdp_core::sample::sample_host().expect("sample host");
    let a10 = sample.adapters[0].clone();
    let template: Vec<RegistryKey> = sample
        .registry
        .iter()
        .filter(|k| k.key.starts_with(&format!(r"{CLASS}\0001\")))
        .cloned()
        .collect();
    let mut facts = HostFacts {
        os: sample.os.clone(),
        adapters: Vec::new(),
        registry: Vec::new(),
        files: sample.files.clone(),
        faults: Vec::new(),
    };
    for i in 0..gpus {
        let mut a = a10.clone();
        a.luid = 0x1000 + i as i64;
        let pnp = a.pnp.as_mut().expect("the sample A10 has a device node");
        pnp.location_paths = vec![format!(
            "PCIROOT({})#PCI({:02X}00)#PCI(0000)",
            i / 32,
            i % 32 + 1
        )];
        pnp.instance_id = format!(r"PCI\VEN_10DE&DEV_2236&SUBSYS_148210DE&REV_A1\4&{i:08X}&0&0008");
        let key = format!("{:04}", i + 1);
        pnp.driver_key = Some(format!("{{4d36e968-e325-11ce-bfc1-08002be10318}}\\{key}"));
        for t in &template {
            facts.registry.push(RegistryKey {
                key: t.key.replace(r"\0001\", &format!(r"\{key}\")),
                values: t.values.clone(),
            });
        }
        facts.adapters.push(a);
    }
    facts
}

/// The median time of one call of `f`, from 7 rounds of about `budget` each.
fn time_per_call(budget: Duration, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    let mut calibrate = 0u32;
    while start.elapsed() < budget / 20 || calibrate < 3 {
        f();
        calibrate += 1;
    }
    let per = start.elapsed() / calibrate;
    let reps = ((budget / 7).as_nanos() / per.as_nanos().max(1)).clamp(3, 10_000_000) as u32;
    let mut rounds: Vec<Duration> = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            t.elapsed() / reps
        })
        .collect();
    rounds.sort();
    rounds[3]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let millis: u64 = std::env::var("DXDP_BENCH_MILLIS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let budget = Duration::from_millis(millis);
    let config = PipelineConfig::default();

    println!("discovery pipeline (discover), hosts of N NVIDIA A10 GPUs with 12 CopyToVm registry values each");
    println!(
        "{:>5} {:>9} {:>10} {:>12} {:>12} {:>14}",
        "GPUs", "reg keys", "files/GPU", "per call", "per GPU", "growth ratio"
    );
    let mut base = None;
    for gpus in [1usize, 16, 64] {
        let facts = host(gpus);
        let d = discover(&facts, &config);
        assert_eq!(d.devices.len(), gpus, "every GPU is a device");
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        let files = d.devices[0].runtime_files.len();
        assert!(files >= 12, "{files} runtime files");
        assert!(d.devices.iter().all(|d| d.runtime_files.len() == files));
        let t = time_per_call(budget, || {
            black_box(discover(black_box(&facts), &config));
        });
        let one = *base.get_or_insert(t);
        println!(
            "{gpus:>5} {:>9} {files:>10} {:>10.1}us {:>10.2}us {:>13.2}x",
            facts.registry.len(),
            us(t),
            us(t) / gpus as f64,
            t.as_secs_f64() / (gpus as f64 * one.as_secs_f64()),
        );
    }

    println!();
    println!("ListAndWatch message for 16 GPUs (device list + protobuf encoding)");
    println!(
        "{:>9} {:>8} {:>9} {:>12} {:>12} {:>14}",
        "replicas", "devices", "bytes", "per message", "per device", "growth ratio"
    );
    let d = discover(&host(16), &config);
    let mut base = None;
    for replicas in [1u32, 16, 64] {
        let message = ListAndWatchResponse {
            devices: device_list(&d, Resource::Display, Sharing::Replicas(replicas)),
        };
        let devices = message.devices.len();
        assert_eq!(devices, 16 * replicas as usize);
        let bytes = message.encoded_len();
        let t = time_per_call(budget, || {
            let m = ListAndWatchResponse {
                devices: device_list(
                    black_box(&d),
                    Resource::Display,
                    Sharing::Replicas(replicas),
                ),
            };
            black_box(m.encode_to_vec());
        });
        let one = *base.get_or_insert(t);
        println!(
            "{replicas:>9} {devices:>8} {bytes:>9} {:>10.1}us {:>10.3}us {:>13.2}x",
            us(t),
            us(t) / devices as f64,
            t.as_secs_f64() / (f64::from(replicas) * one.as_secs_f64()),
        );
    }
}
