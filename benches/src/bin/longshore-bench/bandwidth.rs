//! `bandwidth`: host<->device copies per memory kind and size against the bare driver copy
//! (or, without a GPU, the Cpu backend against a plain `copy_from_slice`).

use std::hint::black_box;

use anyhow::Result;
use longshore::host::{HostBuffer, MemoryKind};
use longshore::transfer::{Device, UploadMode};
use longshore_benches::bare::{bare_dtoh, bare_htod};
use longshore_benches::measure::{gbps, print_table, size_label};
use serde_json::json;

use crate::timing::median_secs;
use crate::{Ctx, MIB};

fn sizes(quick: bool) -> Vec<usize> {
    if quick {
        vec![MIB, 16 * MIB]
    } else {
        vec![MIB, 16 * MIB, 64 * MIB, 256 * MIB]
    }
}

/// How one copy of `bytes` is timed: (samples, copies per sample).
#[derive(Debug, Clone, Copy)]
struct Reps {
    samples: usize,
    per: usize,
}

impl Reps {
    fn new(quick: bool, bytes: usize) -> Reps {
        let per = (16 * MIB / bytes).clamp(1, 16);
        let samples = if bytes >= 256 * MIB {
            5
        } else if quick {
            9
        } else {
            11
        };
        Reps { samples, per }
    }

    /// Median seconds of one call of `f`.
    fn time(self, f: impl FnMut() -> Result<()>) -> Result<f64> {
        median_secs(self.samples, self.per, f)
    }
}

/// The bandwidth table: every row is longshore's path against a bare copy of the same bytes,
/// recorded as three figures (longshore, bare, ratio) that the report pairs up again.
struct Table<'a> {
    ctx: &'a mut Ctx,
    bare_name: &'static str,
    rows: Vec<Vec<String>>,
}

impl<'a> Table<'a> {
    fn new(ctx: &'a mut Ctx, bare_name: &'static str) -> Self {
        Table {
            ctx,
            bare_name,
            rows: Vec::new(),
        }
    }

    /// Records one (ours, bare) pair of median seconds per copy of `bytes`.
    fn row(&mut self, dir: &str, kind: &str, bytes: usize, ours_s: f64, bare_s: f64) {
        let (ours, bare) = (gbps(bytes, ours_s), gbps(bytes, bare_s));
        let ratio = if bare > 0.0 { ours / bare } else { 0.0 };
        let size = size_label(bytes);
        for (path, name, value, unit) in [
            ("longshore", "longshore", ours, "GB/s"),
            ("bare", self.bare_name, bare, "GB/s"),
            ("ratio", "ratio", ratio, "x"),
        ] {
            self.ctx.results.push(
                "bandwidth",
                format!("{dir} {kind} {size} {name}"),
                value,
                unit,
                json!({"dir": dir, "kind": kind, "bytes": bytes, "path": path}),
            );
        }
        self.rows.push(vec![
            dir.to_owned(),
            kind.to_owned(),
            size,
            format!("{ours:.2}"),
            format!("{bare:.2}"),
            format!("{ratio:.2}x"),
        ]);
    }

    fn print(mut self, title: &str) {
        self.rows
            .sort_by(|a, b| a[0].cmp(&b[0]).then(a[1].cmp(&b[1])));
        print_table(
            title,
            &["dir", "kind", "size", "longshore", "bare", "ratio"],
            &self.rows,
        );
    }
}

pub(crate) fn run(ctx: &mut Ctx) -> Result<()> {
    let sizes = sizes(ctx.quick);
    match ctx.cuda.clone() {
        Some(dev) => cuda(ctx, &dev, &sizes),
        None => {
            let why = ctx
                .results
                .machine
                .cuda_reason
                .clone()
                .unwrap_or_else(|| "no CUDA device".to_owned());
            ctx.results.note(
                "bandwidth",
                format!("CUDA matrix skipped ({why}); measured the Cpu backend against a plain copy_from_slice instead"),
            );
            cpu(ctx, &sizes)
        }
    }
}

fn cuda(ctx: &mut Ctx, dev: &Device, sizes: &[usize]) -> Result<()> {
    let quick = ctx.quick;
    let stream = dev.new_stream()?;
    let mut t = Table::new(ctx, "bare");
    for &bytes in sizes {
        let reps = Reps::new(quick, bytes);
        let mut d = stream.alloc_zeroed(bytes)?;
        stream.synchronize()?;
        // Pageable: direct (the driver's own path) and staged, both against the bare copy.
        let mut src = HostBuffer::pageable(bytes)?;
        src.as_bytes_mut().fill(1);
        let bare = reps.time(|| bare_htod(&stream, src.as_bytes(), &mut d))?;
        for (kind, mode) in [
            ("pageable direct", UploadMode::Direct),
            ("pageable staged", UploadMode::Staged),
        ] {
            let ours = reps.time(|| {
                stream
                    .upload_slice(src.as_bytes(), &mut d, 0, mode)?
                    .synchronize()?;
                Ok(())
            })?;
            t.row("H2D", kind, bytes, ours, bare);
        }
        // Owned buffers of every kind: upload and download through the engine (the buffer
        // moves into the copy and comes back), against the bare copy on the same buffer.
        for kind in [
            MemoryKind::Pageable,
            MemoryKind::PageLocked,
            MemoryKind::Registered,
        ] {
            let mut buf = Some(HostBuffer::alloc(kind, bytes)?);
            let name = match kind {
                MemoryKind::Pageable => "pageable direct",
                k => k.as_str(),
            };
            if kind != MemoryKind::Pageable {
                let bare = reps.time(|| bare_htod(&stream, held(&buf).as_bytes(), &mut d))?;
                let ours = reps.time(|| {
                    buf = Some(stream.upload(take(&mut buf), &mut d)?.wait()?);
                    Ok(())
                })?;
                t.row("H2D", name, bytes, ours, bare);
            }
            let bare =
                reps.time(|| bare_dtoh(&stream, &d, buf.as_mut().expect("held").as_bytes_mut()))?;
            let ours = reps.time(|| {
                buf = Some(stream.download(&d, take(&mut buf))?.wait()?);
                Ok(())
            })?;
            t.row("D2H", name, bytes, ours, bare);
        }
    }
    t.print(&format!(
        "bandwidth on {} (median GB/s; bare = cuMemcpy*Async + sync on the same buffer)",
        dev.name()
    ));
    ctx.results.note(
        "bandwidth",
        "D2H has no staged path: pageable downloads go through the driver (\"pageable direct\")",
    );
    let stager = dev.stager()?;
    let ps = stager.pool().stats();
    ctx.results.note(
        "bandwidth",
        format!(
            "staging: {:?}; chunk pool: {} allocations, {} hits, {} pageable fallbacks, peak {} MiB held",
            stager.config(),
            ps.allocations,
            ps.hits,
            ps.fallbacks,
            ps.peak_bytes_held >> 20
        ),
    );
    Ok(())
}

/// The buffer a copy closure moves in and out (always present between copies).
fn held(buf: &Option<HostBuffer>) -> &HostBuffer {
    buf.as_ref().expect("the buffer is back after each copy")
}

fn take(buf: &mut Option<HostBuffer>) -> HostBuffer {
    buf.take().expect("the buffer is back after each copy")
}

fn cpu(ctx: &mut Ctx, sizes: &[usize]) -> Result<()> {
    let quick = ctx.quick;
    let dev = Device::cpu();
    let stream = dev.new_stream()?;
    let mut t = Table::new(ctx, "copy_from_slice");
    for &bytes in sizes {
        let reps = Reps::new(quick, bytes);
        let mut d = stream.alloc_zeroed(bytes)?;
        let src_vec = vec![1u8; bytes];
        let mut dst_vec = vec![0u8; bytes];
        let plain = reps.time(|| {
            dst_vec.copy_from_slice(black_box(&src_vec));
            black_box(&dst_vec);
            Ok(())
        })?;
        let mut src = Some(HostBuffer::from_slice(MemoryKind::Pageable, &src_vec)?);
        let owned = reps.time(|| {
            src = Some(stream.upload(take(&mut src), &mut d)?.wait()?);
            Ok(())
        })?;
        t.row("H2D", "pageable upload", bytes, owned, plain);
        for (kind, mode) in [
            ("pageable direct", UploadMode::Direct),
            ("pageable staged", UploadMode::Staged),
        ] {
            let s = reps.time(|| {
                stream
                    .upload_slice(&src_vec, &mut d, 0, mode)?
                    .synchronize()?;
                Ok(())
            })?;
            t.row("H2D", kind, bytes, s, plain);
        }
        let mut dst = Some(HostBuffer::pageable(bytes)?);
        let down = reps.time(|| {
            dst = Some(stream.download(&d, take(&mut dst))?.wait()?);
            Ok(())
        })?;
        t.row("D2H", "pageable download", bytes, down, plain);
    }
    t.print("bandwidth on the Cpu backend (median GB/s; bare = copy_from_slice between two Vecs)");
    ctx.results.note(
        "bandwidth",
        "page-locked and registered kinds need a CUDA driver: skipped",
    );
    Ok(())
}
