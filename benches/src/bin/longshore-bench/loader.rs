//! `loader`: the DataLoader over two memory-mapped workloads, num_workers x pin_memory.

use anyhow::Result;
use longshore_benches::measure::print_table;
use serde_json::json;

use crate::drive::{Workload, ensure_data, run_workload};
use crate::{Best, Ctx};

pub(crate) fn run(ctx: &mut Ctx) -> Result<()> {
    let files = ensure_data(ctx)?;
    let workers: Vec<usize> = if ctx.quick {
        vec![0, 2]
    } else {
        vec![0, 4, 8, 16]
    };
    let device = ctx.cuda.clone();
    let target = device.as_ref().map_or_else(
        || "consumed on the CPU".to_owned(),
        |d| format!("delivered to {}", d.name()),
    );
    if device.is_none() {
        ctx.results.note(
            "loader",
            "no GPU: batches are consumed on the CPU, and pin_memory falls back to pageable memory",
        );
    }
    if ctx.quick {
        ctx.results.note("loader", "quick: 256 images make one batch per epoch, so each image batch includes an epoch start");
    }
    let mut rows = Vec::new();
    for w in [Workload::Images, Workload::Tabular] {
        let batches = w.sweep_batches(ctx.quick);
        for &nw in &workers {
            for pin in [false, true] {
                let r = run_workload(w, &files, nw, pin, device.as_ref(), batches, None)?;
                let p = json!({"workload": w.name(), "num_workers": nw, "pin_memory": pin, "batch_size": w.batch_size(), "batches": r.batches});
                ctx.results.push(
                    "loader",
                    format!("{} workers={nw} pin={pin}", w.name()),
                    r.samples_per_s,
                    "samples/s",
                    p.clone(),
                );
                ctx.results.push(
                    "loader",
                    format!("{} workers={nw} pin={pin} wait", w.name()),
                    r.wait_fraction,
                    "fraction",
                    {
                        let mut p = p;
                        p["what"] = json!("wait");
                        p
                    },
                );
                rows.push(vec![
                    w.name().to_owned(),
                    nw.to_string(),
                    pin.to_string(),
                    format!("{:.0}", r.samples_per_s),
                    format!("{:.1}%", 100.0 * r.wait_fraction),
                ]);
                let best = ctx.best.entry(w.name()).or_insert(Best {
                    samples_per_s: 0.0,
                    num_workers: nw,
                    pin_memory: pin,
                });
                if r.samples_per_s > best.samples_per_s {
                    *best = Best {
                        samples_per_s: r.samples_per_s,
                        num_workers: nw,
                        pin_memory: pin,
                    };
                }
            }
        }
    }
    print_table(
        &format!(
            "loader: shuffled, {target}; samples/s over a fixed number of batches after one warm-up batch"
        ),
        &["workload", "workers", "pin", "samples/s", "waited"],
        &rows,
    );
    let mut best_rows = Vec::new();
    for (name, b) in &ctx.best {
        ctx.results.push(
            "loader",
            format!("{name} best (workers={}, pin={})", b.num_workers, b.pin_memory),
            b.samples_per_s,
            "samples/s",
            json!({"workload": name, "num_workers": b.num_workers, "pin_memory": b.pin_memory, "what": "best"}),
        );
        best_rows.push(vec![
            (*name).to_owned(),
            b.num_workers.to_string(),
            b.pin_memory.to_string(),
            format!("{:.0}", b.samples_per_s),
        ]);
    }
    print_table(
        "loader: tuner pick (best of the sweep)",
        &["workload", "workers", "pin", "samples/s"],
        &best_rows,
    );
    Ok(())
}
