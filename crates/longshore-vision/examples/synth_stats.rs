//! Statistics of the synthetic ImageNet-like images (`synth`) and one-core rates of decoding
//! and of the ImageNet pipelines on them:
//!
//! ```text
//! cargo run --release -p longshore-vision --example synth_stats [-- N [OUT.jpg]]
//! ```
//!
//! N images (default 200) are generated in memory; OUT.jpg, if given, receives one of them.

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use longshore_data::rng::epoch_rng;
use longshore_vision::Compose;
use longshore_vision::decode::{DecodeOptions, decode_rgb};
use longshore_vision::synth::{FolderSpec, image_jpeg};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(200);
    let spec = FolderSpec::imagenet_like();
    let t = Instant::now();
    let files: Vec<Vec<u8>> = (0..n)
        .map(|i| image_jpeg(&spec, i % spec.classes, i))
        .collect();
    let generate = t.elapsed().as_secs_f64() / n as f64;
    if let Some(out) = args.next() {
        std::fs::write(out, &files[0])?;
    }
    let opts = DecodeOptions::default();
    let t = Instant::now();
    let images: Vec<_> = files
        .iter()
        .map(|f| decode_rgb(f, &opts))
        .collect::<Result<_, _>>()?;
    let decode = n as f64 / t.elapsed().as_secs_f64();
    let bytes: usize = files.iter().map(Vec::len).sum();
    let pixels: usize = images.iter().map(|i| i.width() * i.height()).sum();
    println!(
        "{n} images: mean {:.1} KB, {:.0} px, {:.2} bytes/px; generated in {:.1} ms each",
        bytes as f64 / n as f64 / 1e3,
        pixels as f64 / n as f64,
        bytes as f64 / pixels as f64,
        generate * 1e3
    );
    println!("one core: decode {decode:.0} images/s");
    for (name, p) in [
        ("train", Compose::imagenet_train()),
        ("val", Compose::imagenet_val()),
    ] {
        let mut out = vec![0u8; p.output_bytes()];
        let mut rng = epoch_rng(0, 0);
        let t = Instant::now();
        for img in &images {
            p.apply_into(img, &mut rng, &mut out)?;
            black_box(&out);
        }
        let transform = n as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        for f in &files {
            p.decode_into(Path::new("mem"), f, &opts, &mut rng, &mut out)?;
            black_box(&out);
        }
        let both = n as f64 / t.elapsed().as_secs_f64();
        println!(
            "one core: {name}: transform {transform:.0} images/s, decode + transform {both:.0} images/s"
        );
    }
    Ok(())
}
