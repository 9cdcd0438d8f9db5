//! The event-log record reader (`dxdp_core::health::eventlog`) and the live feed's fault log
//! (`dxdp_core::health::feed`) on arbitrary text: what `EvtRender` returns is read by a small
//! scanner, never a panic, and the log keeps its bounds whatever it is offered: each WER report
//! kept once, and the bookmark of what was read only moves forward. Input: records separated
//! by NUL bytes (the first byte picks the log's capacity).
#![no_main]

use dxdp_core::health::eventlog;
use dxdp_core::health::feed::{self, Bookmark, FaultLog, Offer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let mut log = FaultLog::new(usize::from(head % 8) + 1);
    let mut offered = Vec::new();
    let mut bookmark = Bookmark::new();
    for xml in text.split('\0') {
        if let Ok(record) = eventlog::parse(xml) {
            // A time that parsed formats back to the same second.
            let again = eventlog::parse_time(&eventlog::format_time(record.time_ms));
            assert_eq!(again, Some(record.time_ms / 1000 * 1000));
            let fault = eventlog::fault(&record);
            assert_eq!(eventlog::fault_from_xml(xml), Ok(fault));
        }
        let _ = eventlog::parse_time(xml);
        let before = bookmark.clone();
        let mut noted = None;
        let offer = log.offer_noting(xml.to_string(), 0, |r| {
            noted = Some((r.channel.clone(), r.record_id));
            bookmark.note(r)
        });
        // The bookmark moves forward only, and only for the channel of the record read.
        if let Some((channel, Some(id))) = &noted {
            if !channel.is_empty() {
                let was = before.position(channel);
                assert_eq!(
                    bookmark.position(channel),
                    Some(was.map_or(*id, |w| w.max(*id)))
                );
            }
        }
        let _ = bookmark.to_xml();
        match offer {
            Offer::Added => offered.push(xml.to_string()),
            Offer::Unreadable(e) => assert!(!e.is_empty()),
            Offer::Duplicate | Offer::NotAFault | Offer::TooOld => {}
        }
        let records = log.records();
        assert!(records.len() <= usize::from(head % 8) + 1);
        assert_eq!(
            log.bytes(),
            records.iter().map(|r| r.xml.len()).sum::<usize>()
        );
        // Oldest first, and every kept record is a fault that was offered.
        let times: Vec<u64> = records
            .iter()
            .map(|r| eventlog::parse(&r.xml).map(|p| p.time_ms).unwrap_or(0))
            .collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
        let mut reports = std::collections::HashSet::new();
        for r in &records {
            assert!(offered.contains(&r.xml));
            assert!(matches!(eventlog::fault_from_xml(&r.xml), Ok(Some(_))));
            // A WER report once, whatever how many of its states were offered.
            if let Some(id) = eventlog::parse(&r.xml)
                .ok()
                .and_then(|p| eventlog::report_id(&p))
            {
                assert!(reports.insert(id));
            }
        }
    }
    let (kept, _) = feed::for_snapshot(text.split('\0').map(String::from));
    let merged = feed::merge(&kept, log.records());
    assert!(merged.len() >= kept.len());
});
