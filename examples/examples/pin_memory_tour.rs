//! The design doc's lessons about page-locked ("pinned") memory, measured on this machine:
//! pageable vs page-locked copies, when pinning pays and when it loses, why a device->host copy
//! cannot be read early, pool reuse vs fresh allocation, and what the pinned-memory budget does.
//!
//! ```text
//! cargo run --release --example pin_memory_tour              # on the GPU if there is one
//! cargo run --release --example pin_memory_tour -- --device cpu --max-mib 64
//! ```
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use clap::Parser;
use longshore::host::{BudgetPolicy, HostBuffer, MemoryKind, PinnedPool, PoolConfig};
use longshore::transfer::{Device, DeviceBuffer, UploadMode};
use longshore_examples::{DeviceChoice, pick_device};

const MIB: usize = 1 << 20;

/// A narrated tour of pinned memory, measured here.
#[derive(Debug, Parser)]
struct Args {
    /// The device.
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    device: DeviceChoice,
    /// Largest copy, in MiB (the tour uses 1, 16 and this).
    #[arg(long, default_value_t = 256)]
    max_mib: usize,
    /// Repetitions per measurement (the best is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

/// Best wall time of `reps` runs of `f`.
fn best(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    let mut best = Duration::MAX;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
    }
    Ok(best)
}

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn ms(t: Duration) -> f64 {
    t.as_secs_f64() * 1e3
}

/// The page-locked kind this device can use: cuMemHostAlloc memory with a driver, else mlock'ed
/// memory (which the Cpu device treats like any host memory), else pageable.
fn pinned_kind(device: &Device) -> MemoryKind {
    if !device.is_cpu() {
        return MemoryKind::PageLocked;
    }
    if HostBuffer::locked(MIB).is_ok() {
        MemoryKind::Locked
    } else {
        MemoryKind::Pageable
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let (device, note) = pick_device(args.device)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let s = device.new_stream()?;
    let pinned = pinned_kind(&device);
    let gpu = !device.is_cpu();
    // Pools on the Cpu device use pageable memory: mlock'ed pools are capped by RLIMIT_MEMLOCK,
    // and pinning buys nothing without DMA. On a GPU they are page-locked, as the loader's are.
    let pool_kind = if gpu {
        MemoryKind::PageLocked
    } else {
        MemoryKind::Pageable
    };
    println!(
        "pin_memory tour on {} (page-locked kind here: {pinned})",
        device.name()
    );
    if !gpu {
        println!(
            "note: on the cpu device every \"copy\" is a memcpy by a stream thread, so the \
             pageable/page-locked figures and ratios below are only meaningful on a GPU; the pool, \
             Pending and budget sections behave the same everywhere."
        );
    }

    // 1. Pageable vs page-locked host->device copies.
    println!("\n1. host -> device copies (best of {})", args.reps);
    println!(
        "   {:>8}  {:>12}  {:>12}  {:>14}",
        "size", "pageable", "page-locked", "pageable staged"
    );
    for mib in [1, 16, args.max_mib] {
        let n = mib * MIB;
        let mut dst = s.alloc(n)?;
        let src = vec![7u8; n];
        let direct = best(args.reps, || {
            s.upload_slice(&src, &mut dst, 0, UploadMode::Direct)?
                .synchronize()?;
            Ok(())
        })?;
        let staged = best(args.reps, || {
            s.upload_slice(&src, &mut dst, 0, UploadMode::Staged)?
                .synchronize()?;
            Ok(())
        })?;
        let mut host = Some(HostBuffer::from_slice(pinned, &src)?);
        let locked = best(args.reps, || {
            let buf = host
                .take()
                .expect("the buffer is handed back after each copy");
            host = Some(s.upload(buf, &mut dst)?.wait()?);
            Ok(())
        })?;
        println!(
            "   {:>5} MiB  {:>7.1} GB/s  {:>7.1} GB/s  {:>9.1} GB/s",
            mib,
            gbps(n, direct),
            gbps(n, locked),
            gbps(n, staged)
        );
    }
    println!("   the driver copies pageable memory through its own bounce buffer (two copies);");
    println!("   page-locked memory goes straight to DMA. longshore's loader collates batches");
    println!("   directly into pooled page-locked blocks, so every batch takes the fast column.");

    // 2. Pinning one-shot data loses; pinning a reused buffer pays.
    let n = args.max_mib * MIB;
    let src = vec![3u8; n];
    let mut dst = s.alloc(n)?;
    println!("\n2. when pinning pays ({} MiB, copied once)", args.max_mib);
    let copy_pageable = best(args.reps, || {
        s.upload_slice(&src, &mut dst, 0, UploadMode::Direct)?
            .synchronize()?;
        Ok(())
    })?;
    let pin_then_copy = best(args.reps, || {
        let mut buf = HostBuffer::alloc(pinned, n)?; // allocating page-locked memory is the cost
        buf.as_bytes_mut().copy_from_slice(&src);
        drop(s.upload(buf, &mut dst)?.wait()?);
        Ok(())
    })?;
    let pool = PinnedPool::new(PoolConfig::for_kind(pool_kind).budget(4 * n))?;
    drop(pool.alloc(n)?); // the one allocation; later leases are cache hits
    let pooled = best(args.reps, || {
        let mut lease = pool.alloc(n)?;
        lease.as_bytes_mut().copy_from_slice(&src);
        drop(s.upload(lease, &mut dst)?.wait()?);
        Ok(())
    })?;
    let verdict = |t: Duration| {
        let r = t.as_secs_f64() / copy_pageable.as_secs_f64();
        if r > 1.0 {
            format!("{r:.1}x slower than not pinning")
        } else {
            format!("{:.1}x faster than not pinning", 1.0 / r)
        }
    };
    println!(
        "   copy the pageable data directly            {:>8.1} ms",
        ms(copy_pageable)
    );
    println!(
        "   pin a fresh buffer, fill it, copy (once)   {:>8.1} ms   {}",
        ms(pin_then_copy),
        verdict(pin_then_copy)
    );
    println!(
        "   lease a pooled pinned buffer, fill, copy   {:>8.1} ms   {}",
        ms(pooled),
        verdict(pooled)
    );
    println!(
        "   on a GPU, pinning one-shot data loses (allocating page-locked memory costs more than"
    );
    println!(
        "   the faster copy saves: PyTorch 122 ms vs 32 ms at 256 MiB); a reused pooled buffer pays."
    );

    // 3. Device -> host: Pending.
    println!("\n3. non_blocking device -> host");
    let on_device: DeviceBuffer = s.to_device(&(0..1024u32).collect::<Vec<_>>())?;
    let pending = s.download(&on_device, HostBuffer::alloc(pinned, 4096)?)?;
    println!(
        "   PyTorch's .to(\"cpu\", non_blocking=True) returns a tensor you can read before the"
    );
    println!("   copy lands: silently garbage. longshore's download returns Pending<HostBuffer>:");
    println!("   the buffer was moved into the copy and Pending has no accessor, so reading early");
    println!("   does not compile (see the compile_fail doctests on longshore::transfer::Pending:");
    println!("   E0382 `use of moved value`, E0599 `no method as_slice on Pending`).");
    println!("   ready right after enqueueing? {}", pending.is_ready());
    let t = Instant::now();
    let host = pending.wait()?;
    let ok = host
        .as_slice::<u32>()?
        .iter()
        .enumerate()
        .all(|(i, &v)| v == i as u32);
    ensure!(ok, "the download does not match the upload");
    println!(
        "   wait() took {:.1} us and the 1024 values are correct",
        t.elapsed().as_secs_f64() * 1e6
    );

    // 4. Pool reuse vs fresh allocation.
    println!("\n4. allocation cost, {pool_kind} memory (median of 20)");
    let pool = PinnedPool::new(PoolConfig::for_kind(pool_kind))?;
    for mib in [1, 16] {
        let len = mib * MIB;
        let median = |f: &mut dyn FnMut() -> Result<()>| -> Result<Duration> {
            let mut v = (0..20)
                .map(|_| {
                    let t = Instant::now();
                    f().map(|()| t.elapsed())
                })
                .collect::<Result<Vec<_>>>()?;
            v.sort();
            Ok(v[10])
        };
        let fresh = median(&mut || {
            HostBuffer::alloc(pool_kind, len)
                .map(drop)
                .map_err(Into::into)
        })?;
        drop(pool.alloc(len)?);
        let hit = median(&mut || pool.alloc(len).map(drop).map_err(Into::into))?;
        println!(
            "   {:>2} MiB: fresh allocation {:>9.1} us, pool hit {:>6.2} us ({:.0}x)",
            mib,
            fresh.as_secs_f64() * 1e6,
            hit.as_secs_f64() * 1e6,
            fresh.as_secs_f64() / hit.as_secs_f64().max(1e-9)
        );
    }
    let st = pool.stats();
    println!(
        "   pool: {} hits, {} misses, {} allocations",
        st.hits, st.misses, st.allocations
    );

    // 5. The budget.
    println!("\n5. the pinned-memory budget (32 MiB; 24 MiB leased, then 16 MiB more asked for)");
    for (name, policy) in [
        (
            "Wait (100 ms timeout)",
            BudgetPolicy::Wait {
                timeout: Duration::from_millis(100),
            },
        ),
        (
            "Wait, lease returned after 30 ms",
            BudgetPolicy::Wait {
                timeout: Duration::from_secs(2),
            },
        ),
        ("FallbackPageable", BudgetPolicy::FallbackPageable),
        ("Error", BudgetPolicy::Error),
    ] {
        let pool = PinnedPool::new(
            PoolConfig::for_kind(pool_kind)
                .budget(32 * MIB)
                .policy(policy),
        )?;
        let first = pool.alloc(24 * MIB)?;
        // The lease is kept (or handed to a thread that returns it later) until the ask.
        let (giver, _kept) = if name.contains("returned") {
            let g = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                drop(first);
            });
            (Some(g), None)
        } else {
            (None, Some(first))
        };
        let t = Instant::now();
        let outcome = match pool.alloc(16 * MIB) {
            Ok(b) if b.is_fallback() => format!(
                "got 16 MiB of {} memory (fallback, counted: {} fallbacks)",
                b.kind(),
                pool.stats().fallbacks
            ),
            Ok(b) => format!(
                "got 16 MiB of {} memory after {:.0} ms",
                b.kind(),
                ms(t.elapsed())
            ),
            Err(e) => format!("error after {:.0} ms: {e}", ms(t.elapsed())),
        };
        if let Some(g) = giver {
            let _ = g.join();
        }
        println!("   {name:<34} {outcome}");
    }
    println!(
        "   the machine never freezes from over-pinning: the pool waits, falls back or fails."
    );
    Ok(())
}
