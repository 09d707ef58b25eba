//! `pool`: a pool hit against a raw allocation, per memory kind and size.

use std::hint::black_box;
use std::time::Duration;

use anyhow::Result;
use longshore::host::{HostBuffer, MemoryKind, PinnedPool, PoolConfig};
use longshore_benches::measure::{ns_label, print_table, size_label};
use serde_json::json;

use crate::timing::median_ns_calibrated;
use crate::{Ctx, KIB, MIB};

pub(crate) fn run(ctx: &mut Ctx) -> Result<()> {
    let mut sizes = vec![KIB, 64 * KIB, MIB, 16 * MIB];
    if !ctx.quick {
        sizes.push(256 * MIB);
    }
    let mut kinds = vec![MemoryKind::Pageable];
    if longshore::host::driver_available() {
        kinds.extend([MemoryKind::PageLocked, MemoryKind::Registered]);
    } else {
        ctx.results.note(
            "pool",
            "no CUDA driver: page-locked and registered kinds skipped",
        );
    }
    let budget = if ctx.quick {
        Duration::from_millis(60)
    } else {
        Duration::from_millis(300)
    };
    let mut rows = Vec::new();
    for kind in kinds {
        let pool = match PinnedPool::new(
            PoolConfig::for_kind(kind)
                .budget(1 << 30)
                .register_above(None),
        ) {
            Ok(p) => p,
            Err(e) => {
                ctx.results.note("pool", format!("no {kind} pool: {e}"));
                continue;
            }
        };
        for &bytes in &sizes {
            drop(pool.alloc(bytes)?); // warm the cache
            let hit = median_ns_calibrated(budget, || {
                drop(black_box(pool.alloc(black_box(bytes))?));
                Ok(())
            })?;
            let raw = median_ns_calibrated(budget, || {
                drop(black_box(HostBuffer::alloc(kind, black_box(bytes))?));
                Ok(())
            })?;
            let size = size_label(bytes);
            let p = |what: &str| json!({"kind": kind.as_str(), "bytes": bytes, "what": what});
            ctx.results.push(
                "pool",
                format!("{kind} {size} pool hit"),
                hit,
                "ns",
                p("hit"),
            );
            ctx.results.push(
                "pool",
                format!("{kind} {size} raw alloc"),
                raw,
                "ns",
                p("raw"),
            );
            ctx.results.push(
                "pool",
                format!("{kind} {size} raw/hit"),
                raw / hit,
                "x",
                p("ratio"),
            );
            rows.push(vec![
                kind.to_string(),
                size,
                ns_label(hit),
                ns_label(raw),
                format!("{:.1}x", raw / hit),
            ]);
        }
    }
    print_table(
        "pool: alloc + drop of a cached block vs a raw allocation (HostBuffer::alloc + drop), medians",
        &["kind", "size", "pool hit", "raw alloc", "raw/hit"],
        &rows,
    );
    Ok(())
}
