//! `roofline`: each workload's best steady-state rate (the loader sweep) as a fraction of
//! every limit measured by `limits` that can bound it; the smallest limit the workload does
//! not exceed is the bound (one it runs past is marked "exceeded": its measure understates
//! the hardware).
//!
//! | workload | limits (samples/s) |
//! | --- | --- |
//! | images (f32 to the device) | link GB/s / f32 bytes per image; host memory traffic / bytes moved per image; the all-core normalise rate |
//! | tabular | link GB/s / bytes per sample; the all-core random gather rate; host memory traffic / bytes moved per sample |
//!
//! Host memory traffic is twice the all-core copy rate (a copy reads and writes each byte);
//! a sample moves its source bytes once (read), its batch bytes once (written) and, with a
//! GPU, its batch bytes once more (read by the copy engine).

use anyhow::Result;
use longshore_benches::measure::print_table;
use serde_json::json;

use crate::Ctx;
use crate::drive::Workload;

pub(crate) fn run(ctx: &mut Ctx) -> Result<()> {
    let Some(lim) = ctx.limits.clone() else {
        ctx.results.note(
            "roofline",
            "skipped: run the limits section in the same run",
        );
        return Ok(());
    };
    let mut rows = Vec::new();
    for w in Workload::ALL {
        let Some(best) = ctx.best.get(w.name()).copied() else {
            ctx.results.note(
                "roofline",
                format!(
                    "no {} row: run the loader section in the same run",
                    w.name()
                ),
            );
            continue;
        };
        let per = w.sample_bytes() as f64;
        let mut limits: Vec<(&str, f64)> = Vec::new();
        let link = match w {
            Workload::Images => lim.link_images_gbps,
            Workload::ImagesU8 => lim.link_images_u8_gbps,
            Workload::Tabular => lim.link_tabular_gbps,
        };
        if let Some(g) = link {
            limits.push(("host-to-device link", g * 1e9 / per));
        }
        let source = match w {
            Workload::Images => per / 4.0, // u8 pixels in, f32 out
            Workload::ImagesU8 | Workload::Tabular => per,
        };
        let dma = if link.is_some() { per } else { 0.0 };
        limits.push((
            "host memory traffic",
            2.0 * lim.mem_copy_gbps * 1e9 / (source + per + dma),
        ));
        match w {
            Workload::Images => limits.push(("normalise, all cores", lim.normalize_images_per_s)),
            // Normalised on the device: the host only copies u8 rows into the batch.
            Workload::ImagesU8 => {}
            Workload::Tabular => {
                limits.push(("random gather, all cores", lim.gather_samples_per_s))
            }
        }
        // A limit the workload runs past is a measure that understates what the hardware
        // does (host memory traffic: all-core CPU copies reach less than the copy engine's
        // reads plus the workers' streaming stores), not a bound: the bound is the smallest
        // limit not exceeded.
        let bound = limits
            .iter()
            .map(|l| l.1)
            .filter(|&l| best.samples_per_s <= l)
            .fold(f64::INFINITY, f64::min);
        for (name, limit) in limits {
            let fraction = best.samples_per_s / limit.max(1e-9);
            let is_bound = limit == bound;
            let label = if is_bound {
                "bound"
            } else if fraction > 1.0 {
                "exceeded: not a bound"
            } else {
                ""
            };
            ctx.results.push(
                "roofline",
                format!("{} vs {name}", w.name()),
                fraction,
                "fraction",
                json!({"workload": w.name(), "limit": name, "limit_samples_per_s": limit,
                       "samples_per_s": best.samples_per_s, "bound": is_bound,
                       "exceeded": fraction > 1.0,
                       "num_workers": best.num_workers, "pin_memory": best.pin_memory}),
            );
            rows.push(vec![
                w.name().to_owned(),
                format!("{:.0}", best.samples_per_s),
                name.to_owned(),
                format!("{limit:.0}"),
                format!("{:.1}%", 100.0 * fraction),
                label.to_owned(),
            ]);
        }
    }
    print_table(
        "roofline: best steady-state rate as a fraction of each limit (samples/s)",
        &["workload", "best", "limit", "limit rate", "fraction", ""],
        &rows,
    );
    Ok(())
}
