//! Sweeps the staged pageable upload over piece sizes and thread counts, against the driver's
//! own pageable path measured in the same run: the evidence behind `StagingConfig`'s defaults.
//!
//! `staging-sweep [--quick]`: on `cuda:0` when a driver is present, else on the `Cpu` device
//! (where it only proves the sweep runs). Prints one table; each figure is the median of
//! several uploads of a warm, page-faulted pageable source.

use std::time::Instant;

use anyhow::Result;
use longshore::host::HostBuffer;
use longshore::transfer::{Device, Stager, StagingConfig, Stream, UploadMode};
use longshore_benches::measure::{gbps, median, print_table, size_label};

const MIB: usize = 1 << 20;
const KIB: usize = 1 << 10;

/// Median seconds of `reps` runs of `f` after two warm-up runs.
fn median_secs(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    f()?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        f()?;
        t.push(t0.elapsed().as_secs_f64());
    }
    Ok(median(&t))
}

fn reps(bytes: usize) -> usize {
    (512 * MIB / bytes).clamp(5, 31)
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let dev = match Device::cuda(0) {
        Ok(d) => d,
        Err(e) => {
            println!("staging-sweep: no CUDA device ({e}); sweeping the Cpu backend");
            Device::cpu()
        }
    };
    let sizes: Vec<usize> = if quick {
        vec![16 * MIB, 64 * MIB]
    } else {
        vec![8 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]
    };
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut threads: Vec<usize> = vec![StagingConfig::default().threads, cores * 3 / 4];
    threads.sort_unstable();
    threads.dedup();
    // (label, chunk_bytes, min_chunk_bytes): fixed pieces, then the adaptive policy.
    let mut shapes: Vec<(String, usize, usize)> = [256 * KIB, 512 * KIB, MIB, 2 * MIB, 4 * MIB]
        .into_iter()
        .map(|p| (format!("fixed {}", size_label(p)), p, p))
        .collect();
    let d = StagingConfig::default();
    shapes.push((
        format!(
            "adaptive {}..{}",
            size_label(d.min_chunk_bytes),
            size_label(d.chunk_bytes)
        ),
        d.chunk_bytes,
        d.min_chunk_bytes,
    ));
    shapes.push(("adaptive 512 KiB..4 MiB".to_owned(), 4 * MIB, 512 * KIB));

    let max = *sizes.iter().max().expect("sizes");
    let mut src = HostBuffer::pageable(max)?;
    for (i, b) in src.as_bytes_mut().iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13);
    }
    let stream: Stream = dev.new_stream()?;
    let mut dst = stream.alloc(max)?;
    println!("staging-sweep on {} ({cores} cores)", dev.name());

    let mut driver = Vec::new();
    for &bytes in &sizes {
        let s = median_secs(reps(bytes), || {
            stream
                .upload_slice(&src.as_bytes()[..bytes], &mut dst, 0, UploadMode::Direct)?
                .synchronize()?;
            Ok(())
        })?;
        driver.push(gbps(bytes, s));
    }
    let mut rows = vec![{
        let mut r = vec!["driver (direct)".to_owned(), "-".to_owned()];
        r.extend(driver.iter().map(|g| format!("{g:.1}")));
        r
    }];
    for &t in &threads {
        for (label, chunk, min) in &shapes {
            let stager = Stager::new(
                &dev,
                StagingConfig {
                    chunk_bytes: *chunk,
                    min_chunk_bytes: *min,
                    threads: t,
                    ..StagingConfig::default()
                },
            )?;
            let mut row = vec![label.clone(), t.to_string()];
            for (k, &bytes) in sizes.iter().enumerate() {
                let s = median_secs(reps(bytes), || {
                    stager
                        .upload(&stream, &src.as_bytes()[..bytes], &mut dst, 0)?
                        .synchronize()?;
                    Ok(())
                })?;
                let g = gbps(bytes, s);
                row.push(format!("{g:.1} ({:.2}x)", g / driver[k]));
            }
            let ps = stager.pool().stats();
            if ps.fallbacks > 0 {
                row[0].push_str(&format!(" [{} pageable fallbacks]", ps.fallbacks));
            }
            rows.push(row);
        }
    }
    let mut header = vec!["pieces".to_owned(), "threads".to_owned()];
    header.extend(sizes.iter().map(|&b| size_label(b)));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    print_table(
        "staged pageable H2D, GB/s (x the driver's pageable path, same run)",
        &header,
        &rows,
    );
    Ok(())
}
