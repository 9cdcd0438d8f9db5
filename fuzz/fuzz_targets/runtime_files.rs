//! The registry-value to runtime-file rules: host facts decoded from the input go through the
//! whole discovery pipeline. Whatever the registry says, every mount lands directly in System32 or
//! SysWOW64 and comes from inside the driver store.
#![no_main]

use dxdp_core::pipeline::{discover, winpath, PipelineConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let facts = dxdp_fuzz::bytes::host_facts(data);
    let discovery = discover(&facts, &PipelineConfig::default());
    let _ = dxdp_core::pipeline::runtime_files::candidate_host_paths(&facts);
    for device in &discovery.devices {
        let store = device.driver_store_path.as_deref().unwrap_or_default();
        for (_, file) in device.runtime_files.iter() {
            assert!(
                winpath::is_within(&file.host_path, store),
                "{} outside {store}",
                file.host_path
            );
            assert!(
                !file.destination.contains(['\\', '/', ':']) && file.destination != "..",
                "destination {:?}",
                file.destination
            );
        }
    }
});
