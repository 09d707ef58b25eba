//! The bench's JSON result as the Markdown table docs/benchmarks.md shows.

use serde_json::Value;

/// The machine's CPU time a run spent per 1,000 images: its share of every core's time over
/// its rate (the whole machine is counted: the loader's workers and consumer, or PyTorch's
/// worker processes and main process alike).
fn cpu_seconds(run: &Value, cores: &Value) -> String {
    match (
        run["cpu_share"].as_f64(),
        cores.as_f64(),
        run["samples_per_s"].as_f64(),
    ) {
        (Some(share), Some(cores), Some(rate)) if rate > 0.0 => {
            format!("{:.2}", share * cores / rate * 1e3)
        }
        _ => "-".to_owned(),
    }
}

pub(crate) fn markdown(r: &Value) -> String {
    let f = |v: &Value| v.as_f64().map_or("-".to_owned(), |x| format!("{x:.0}"));
    let pct = |v: &Value| {
        v.as_f64()
            .map_or("-".to_owned(), |x| format!("{:.0}%", 100.0 * x))
    };
    let pc = &r["per_core"];
    let mut s = format!(
        "## jpeg: ImageNet-like folder ({} images, {:.0} KB mean, {:.0} px mean), {} cores, cuda: {}\n\n\
         One core: decode {} images/s; train decode+transform {} (transform alone {}); val {} ({}).\n\n\
         | pipeline | who | workers | pin | images/s | CPU share | CPU s per 1,000 images |\n|---|---|---|---|---|---|---|\n",
        r["folder"]["images"],
        pc["mean_file_bytes"].as_f64().unwrap_or(0.0) / 1e3,
        pc["mean_pixels"].as_f64().unwrap_or(0.0),
        r["machine"]["cores"],
        r["machine"]["cuda"],
        f(&pc["decode_images_per_s"]),
        f(&pc["train_decode_transform_images_per_s"]),
        f(&pc["train_transform_images_per_s"]),
        f(&pc["val_decode_transform_images_per_s"]),
        f(&pc["val_transform_images_per_s"]),
    );
    for name in ["train", "val"] {
        for (who, b) in [
            ("longshore", &r["longshore"][name]["best"]),
            ("longshore nvjpeg", &r["longshore_nvjpeg"][name]["best"]),
            ("pytorch", &r["pytorch"]["best"][name]),
            (
                "torchvision decode_jpeg(cuda) + resize, batch 256",
                &r["pytorch"]["gpu_decode"][name],
            ),
        ] {
            if b.is_null() {
                continue;
            }
            let or_dash = |v: &Value| {
                if v.is_null() {
                    "-".to_owned()
                } else {
                    v.to_string()
                }
            };
            s += &format!(
                "| {name} | {who} (best) | {} | {} | {} | {} | {} |\n",
                or_dash(&b["num_workers"]),
                or_dash(&b["pin_memory"]),
                f(&b["samples_per_s"]),
                pct(&b["cpu_share"]),
                cpu_seconds(b, &r["machine"]["cores"]),
            );
        }
    }
    let ce = &r["nvjpeg_ceiling"];
    if ce["decode"].is_number() {
        s += &format!(
            "\nnvJPEG ceiling, one thread, batch {} in page-locked memory, no loader (images/s): \
             marker walk {}, hardware batched decode {}, GPU_HYBRID batched decode {}, \
             with nvJPEG's per-image checks {}, device stage (routes trusted, kernel) {}, \
             with checks {}\n",
            ce["batch_size"],
            f(&ce["walk"]),
            f(&ce["decode"]),
            f(&ce["decode_cuda"]),
            f(&ce["decode_checked"]),
            f(&ce["pipeline"]),
            f(&ce["pipeline_checked"]),
        );
        s += &format!(
            "Several threads at once, each with its own states and stream (images/s together): \
             decode on 2 threads {}, 4 threads {}; device stage on 2 threads {}, 4 threads {}\n",
            f(&ce["decode_threads_2"]),
            f(&ce["decode_threads_4"]),
            f(&ce["pipeline_threads_2"]),
            f(&ce["pipeline_threads_4"]),
        );
    }
    for name in ["train", "val"] {
        let b = &r["longshore_nvjpeg"][name]["best"];
        if b["cpu_share_of_jpegs"].is_number() {
            s += &format!(
                "\nnvJPEG, {name} (best run): {} of the JPEGs decoded by the workers \
                 (`--cpu-share`); per timed epoch (ms) {}; warm-up epoch {}\n",
                b["cpu_share_of_jpegs"], b["epoch_ms"], b["warmup_epoch_ms"]
            );
        }
        if let Some(phases) = b["device_stage_us_per_image"].as_object() {
            let list: Vec<String> = phases
                .iter()
                .map(|(k, v)| format!("{k} {:.1}", v.as_f64().unwrap_or(0.0)))
                .collect();
            s += &format!(
                "\nnvJPEG device stage, {name} (best run), us per image: {}\n",
                list.join(", ")
            );
        }
    }
    if let Some(skip) = r["longshore_nvjpeg"]["train"]["skipped"].as_str() {
        s += &format!("\nnvJPEG rows skipped: {skip}\n");
    }
    if let Some(skip) = r["pytorch"]["skipped"].as_str() {
        s += &format!("\nPyTorch baseline skipped: {skip}\n");
    }
    for (name, ratio) in r["ratio_vs_pytorch"].as_object().into_iter().flatten() {
        s += &format!(
            "\n{name}: longshore / PyTorch best = {:.2}x",
            ratio.as_f64().unwrap_or(0.0)
        );
    }
    s + "\n"
}
