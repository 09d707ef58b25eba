//! `loader`: the DataLoader over two memory-mapped workloads, num_workers x pin_memory, in
//! steady state (see [`crate::drive`]).

use anyhow::Result;
use longshore_benches::measure::print_table;
use serde_json::json;

use crate::drive::{METHOD, Opts, Workload, ensure_data, steady_run};
use crate::{Best, Ctx};

pub(crate) fn run(ctx: &mut Ctx) -> Result<()> {
    let files = ensure_data(ctx)?;
    let workers: Vec<usize> = if ctx.quick {
        vec![0, 2]
    } else {
        vec![0, 4, 8, 16]
    };
    let target = ctx.cuda.as_ref().map_or_else(
        || "consumed on the CPU".to_owned(),
        |d| format!("delivered to {}", d.name()),
    );
    if ctx.cuda.is_none() {
        ctx.results.note(
            "loader",
            "no GPU: batches are consumed on the CPU, and pin_memory falls back to pageable memory",
        );
    }
    ctx.results.note("loader", format!("method: {METHOD}"));
    if ctx.quick {
        ctx.results.note(
            "loader",
            "quick: 512 images make two batches per epoch; the quick figures prove the sections run, they are no throughput claim",
        );
    }
    let mut rows = Vec::new();
    for w in Workload::ALL {
        for &nw in &workers {
            for pin in [false, true] {
                let opts = Opts {
                    num_workers: nw,
                    pin_memory: pin,
                };
                let r = steady_run(ctx, &files, w, opts)?;
                let p = json!({"workload": w.name(), "num_workers": nw, "pin_memory": pin,
                    "batch_size": w.batch_size(), "batches": r.batches, "epochs": r.epochs,
                    "secs": r.secs, "prefetch_factor": 2, "persistent_workers": nw > 0});
                ctx.results.push(
                    "loader",
                    format!("{} workers={nw} pin={pin}", w.name()),
                    r.samples_per_s,
                    "samples/s",
                    p.clone(),
                );
                let mut pw = p;
                pw["what"] = json!("wait");
                ctx.results.push(
                    "loader",
                    format!("{} workers={nw} pin={pin} wait", w.name()),
                    r.wait_fraction,
                    "fraction",
                    pw,
                );
                rows.push(vec![
                    w.name().to_owned(),
                    nw.to_string(),
                    pin.to_string(),
                    format!("{:.0}", r.samples_per_s),
                    format!("{}/{}", r.epochs, r.batches),
                    format!("{:.1}%", 100.0 * r.wait_fraction),
                ]);
                Best::offer(
                    &mut ctx.best,
                    w.name(),
                    Best {
                        samples_per_s: r.samples_per_s,
                        num_workers: nw,
                        pin_memory: pin,
                    },
                );
            }
        }
    }
    print_table(
        &format!("loader: shuffled, {target}; steady state (whole epochs after a warm-up epoch)"),
        &[
            "workload",
            "workers",
            "pin",
            "samples/s",
            "epochs/batches",
            "waited",
        ],
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
