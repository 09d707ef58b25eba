//! `overlap`: how long the consumer waits for data when compute outlasts the copy.
//!
//! The data time per batch comes from the steady-state run of the loader sweep (whole
//! epochs); the wait is then measured within an epoch, after the pipeline fill, since the
//! question here is whether copies overlap compute once the pipeline is full (the fill at
//! each epoch start is in the loader figures).

use std::time::Duration;

use anyhow::Result;
use longshore_benches::measure::print_table;
use serde_json::json;

use crate::Ctx;
use crate::drive::{Opts, Window, Workload, ensure_data, run_workload, steady_run};

pub(crate) fn run(ctx: &mut Ctx) -> Result<()> {
    let files = ensure_data(ctx)?;
    let device = ctx.cuda.clone();
    let cores = ctx.results.machine.cores;
    let mut workloads = vec![Workload::Tabular];
    if !ctx.quick {
        workloads.push(Workload::Images);
    } else {
        ctx.results.note(
            "overlap",
            "quick: tabular only (the quick image file holds two batches per epoch)",
        );
    }
    let mut rows = Vec::new();
    for w in workloads {
        let nw = (cores / 2).clamp(1, 8);
        let warmup = nw + 1;
        let batches = match (w, ctx.quick) {
            (Workload::Tabular, true) => 40,
            (Workload::Tabular, false) => 200,
            // One epoch holds 32 image batches: measure within it, after the pipeline fill.
            (Workload::Images | Workload::ImagesU8, _) => 32 - warmup,
        };
        let opts = Opts {
            num_workers: nw,
            pin_memory: true,
        };
        // Calibrate: how long the loader (and copy) takes per batch with nothing else to do.
        let cal = steady_run(ctx, &files, w, opts)?;
        let per_batch = w.batch_size() as f64 / cal.samples_per_s.max(1e-9);
        let t = Duration::from_secs_f64((1.5 * per_batch).max(2e-3));
        let window = Window::Batches { warmup, batches };
        let r = run_workload(w, &files, opts, device.as_ref(), window, Some(t), None)?;
        let p = json!({"workload": w.name(), "num_workers": nw, "pin_memory": true, "compute_ms": t.as_secs_f64() * 1e3, "data_ms": per_batch * 1e3});
        ctx.results.push(
            "overlap",
            format!("{} wait fraction", w.name()),
            r.wait_fraction,
            "fraction",
            p.clone(),
        );
        ctx.results.push(
            "overlap",
            format!("{} compute per batch", w.name()),
            t.as_secs_f64() * 1e3,
            "ms",
            p.clone(),
        );
        ctx.results.push(
            "overlap",
            format!("{} data per batch (unloaded)", w.name()),
            per_batch * 1e3,
            "ms",
            p,
        );
        rows.push(vec![
            w.name().to_owned(),
            nw.to_string(),
            format!("{:.2}", per_batch * 1e3),
            format!("{:.2}", t.as_secs_f64() * 1e3),
            format!("{:.2}%", 100.0 * r.wait_fraction),
            if r.wait_fraction < 0.02 {
                "yes".to_owned()
            } else {
                "NO".to_owned()
            },
        ]);
    }
    let how = if device.is_some() {
        "compute = host fn sleeping on the compute stream"
    } else {
        "compute = sleep on the consumer thread"
    };
    print_table(
        &format!("overlap: consumer wait when compute per batch > data time ({how}; target < 2%)"),
        &[
            "workload",
            "workers",
            "data ms/batch",
            "compute ms",
            "waited",
            "< 2%",
        ],
        &rows,
    );
    Ok(())
}
