//! Prints the mean file size and dimensions of synthetic images (tuning aid).
fn main() {
    let spec = longshore_vision::synth::FolderSpec::imagenet_like();
    let n = 200;
    let (mut bytes, mut px) = (0usize, 0usize);
    let t = std::time::Instant::now();
    for i in 0..n {
        let j = longshore_vision::synth::image_jpeg(&spec, i % 10, i);
        let img = longshore_vision::decode::decode_rgb(&j, &Default::default()).unwrap();
        bytes += j.len();
        px += img.width() * img.height();
    }
    if let Some(p) = std::env::args().nth(1) {
        std::fs::write(p, longshore_vision::synth::image_jpeg(&spec, 3, 7)).unwrap();
    }
    println!(
        "mean {:.1} KB, {:.0} px, {:.2} B/px, {:.1} ms/img",
        bytes as f64 / n as f64 / 1e3,
        px as f64 / n as f64,
        bytes as f64 / px as f64,
        t.elapsed().as_secs_f64() * 1e3 / n as f64
    );
}
