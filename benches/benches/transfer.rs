//! Bandwidth matrix of the transfer engine: {pageable direct, pageable staged, page-locked,
//! registered} x {H2D, D2H} x {1, 16, 64, 256 MiB}, each against a bare `cuMemcpy*Async` + stream
//! synchronisation on the same buffers in the same run.
//!
//! Without a CUDA driver it says so and measures the `Cpu` backend's copy throughput instead, so
//! the bench runs everywhere. `LONGSHORE_BENCH_QUICK=1`: 1 and 16 MiB only, short measurements.
//! Besides criterion's report, each case prints one line:
//! `transfer <device> <dir> <source> <size>: engine X GB/s, bare Y GB/s, engine/bare Z`.
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use longshore::host::{HostBuffer, MemoryKind};
use longshore::transfer::{Device, DeviceBuffer, Stream, UploadMode};
use longshore_benches::bare::{bare_dtoh, bare_htod};

#[derive(Clone, Copy, Debug)]
enum Source {
    PageableDirect,
    PageableStaged,
    PageLocked,
    Registered,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::PageableDirect => "pageable-direct",
            Source::PageableStaged => "pageable-staged",
            Source::PageLocked => "page-locked",
            Source::Registered => "registered",
        }
    }
    fn kind(self) -> MemoryKind {
        match self {
            Source::PageableDirect | Source::PageableStaged => MemoryKind::Pageable,
            Source::PageLocked => MemoryKind::PageLocked,
            Source::Registered => MemoryKind::Registered,
        }
    }
}

fn quick() -> bool {
    std::env::var("LONGSHORE_BENCH_QUICK").is_ok_and(|v| v == "1")
}

fn mib(bytes: usize) -> String {
    format!("{}MiB", bytes >> 20)
}

/// Median seconds of `f` over enough runs to fill about `budget`.
fn median_secs(budget: Duration, mut f: impl FnMut()) -> f64 {
    f(); // warm-up
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 3 || (start.elapsed() < budget && times.len() < 200) {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

struct Case<'a> {
    stream: &'a Stream,
    device_label: &'a str,
    size: usize,
}

/// One engine H2D copy of `host` into `dev`, synchronised.
fn engine_h2d(
    stream: &Stream,
    source: Source,
    host: &mut Option<HostBuffer>,
    dev: &mut DeviceBuffer,
) {
    match source {
        Source::PageableDirect | Source::PageableStaged => {
            let mode = if matches!(source, Source::PageableDirect) {
                UploadMode::Direct
            } else {
                UploadMode::Staged
            };
            let src = host.as_ref().expect("source present");
            stream
                .upload_slice(src.as_bytes(), dev, 0, mode)
                .expect("upload")
                .synchronize()
                .expect("sync");
        }
        Source::PageLocked | Source::Registered => {
            let src = host.take().expect("source present");
            *host = Some(
                stream
                    .upload(src, dev)
                    .expect("upload")
                    .wait()
                    .expect("wait"),
            );
        }
    }
}

/// One engine D2H copy of `dev` into `host`, synchronised.
fn engine_d2h(stream: &Stream, host: &mut Option<HostBuffer>, dev: &DeviceBuffer) {
    let dst = host.take().expect("destination present");
    *host = Some(
        stream
            .download(dev, dst)
            .expect("download")
            .wait()
            .expect("wait"),
    );
}

fn run_matrix(c: &mut Criterion, case: &Case<'_>, sources: &[Source], budget: Duration) {
    let Case {
        stream,
        device_label,
        size,
    } = *case;
    let mut dev = stream.alloc(size).expect("device alloc");
    stream.memset(&mut dev, 1).expect("memset");
    stream.synchronize().expect("sync");
    let gb = |secs: f64| size as f64 / secs / 1e9;
    let mut staged_h2d = None;
    let mut driver_pageable_h2d = None;
    for &source in sources {
        let mut host = match HostBuffer::alloc(source.kind(), size) {
            Ok(mut b) => {
                b.as_bytes_mut()
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = i as u8);
                Some(b)
            }
            Err(e) => {
                println!(
                    "transfer {device_label} {} {}: skipped, cannot allocate the host buffer: {e}",
                    source.name(),
                    mib(size)
                );
                continue;
            }
        };
        for dir in ["h2d", "d2h"] {
            if dir == "d2h" && matches!(source, Source::PageableStaged) {
                println!(
                    "transfer {device_label} d2h {} {}: n/a (device->host copies are not staged)",
                    source.name(),
                    mib(size)
                );
                continue;
            }
            // The compact table line, from our own timing.
            let engine = if dir == "h2d" {
                median_secs(budget, || engine_h2d(stream, source, &mut host, &mut dev))
            } else {
                median_secs(budget, || engine_d2h(stream, &mut host, &dev))
            };
            let bare = if dir == "h2d" {
                median_secs(budget, || {
                    bare_htod(stream, host.as_ref().expect("host").as_bytes(), &mut dev)
                        .expect("bare h2d")
                })
            } else {
                median_secs(budget, || {
                    bare_dtoh(stream, &dev, host.as_mut().expect("host").as_bytes_mut())
                        .expect("bare d2h")
                })
            };
            println!(
                "transfer {device_label} {dir} {:<16} {:>7}: engine {:7.2} GB/s, bare {:7.2} GB/s, engine/bare {:5.2}",
                source.name(),
                mib(size),
                gb(engine),
                gb(bare),
                bare / engine
            );
            if dir == "h2d" {
                match source {
                    Source::PageableStaged => staged_h2d = Some(engine),
                    Source::PageableDirect => driver_pageable_h2d = Some(bare),
                    _ => {}
                }
            }

            // The same cases under criterion.
            let mut group = c.benchmark_group(format!("transfer/{device_label}/{dir}"));
            group.throughput(Throughput::Bytes(size as u64));
            group.bench_function(
                BenchmarkId::new(format!("{}/engine", source.name()), mib(size)),
                |b| {
                    if dir == "h2d" {
                        b.iter(|| engine_h2d(stream, source, &mut host, &mut dev))
                    } else {
                        b.iter(|| engine_d2h(stream, &mut host, &dev))
                    }
                },
            );
            group.bench_function(
                BenchmarkId::new(format!("{}/bare", source.name()), mib(size)),
                |b| {
                    if dir == "h2d" {
                        b.iter(|| {
                            bare_htod(
                                stream,
                                black_box(host.as_ref().expect("host").as_bytes()),
                                &mut dev,
                            )
                            .expect("bare")
                        })
                    } else {
                        b.iter(|| {
                            bare_dtoh(
                                stream,
                                &dev,
                                black_box(host.as_mut().expect("host").as_bytes_mut()),
                            )
                            .expect("bare")
                        })
                    }
                },
            );
            group.finish();
        }
    }
    if let (Some(staged), Some(driver)) = (staged_h2d, driver_pageable_h2d) {
        println!(
            "transfer {device_label} h2d staged-vs-driver-pageable {:>7}: staged {:7.2} GB/s vs driver {:7.2} GB/s = {:5.2}x (target >= 3x at >= 64 MiB)",
            mib(size),
            gb(staged),
            gb(driver),
            driver / staged
        );
    }
}

fn main() {
    let quick = quick();
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(if quick { 200 } else { 1000 }))
        .measurement_time(Duration::from_millis(if quick { 500 } else { 3000 }))
        .configure_from_args();
    let sizes: &[usize] = if quick {
        &[1 << 20, 16 << 20]
    } else {
        &[1 << 20, 16 << 20, 64 << 20, 256 << 20]
    };
    let budget = Duration::from_millis(if quick { 150 } else { 600 });

    let (device, label, sources): (Device, String, Vec<Source>) = match Device::cuda(0) {
        Ok(d) => {
            let label = d.id().to_string();
            println!("transfer: measuring on {}", d.name());
            (
                d,
                label,
                vec![
                    Source::PageableDirect,
                    Source::PageableStaged,
                    Source::PageLocked,
                    Source::Registered,
                ],
            )
        }
        Err(e) => {
            println!(
                "transfer: no CUDA device ({e}); measuring the Cpu backend's copy throughput instead"
            );
            (
                Device::cpu(),
                "cpu".to_owned(),
                vec![Source::PageableDirect, Source::PageableStaged],
            )
        }
    };
    if let Ok(stager) = device.stager() {
        println!("transfer: staging config {:?}", stager.config());
    }
    let stream = device.new_stream().expect("stream");
    for &size in sizes {
        run_matrix(
            &mut c,
            &Case {
                stream: &stream,
                device_label: &label,
                size,
            },
            &sources,
            budget,
        );
    }
    c.final_summary();
}
