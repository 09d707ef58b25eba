//! Staged uploads on CUDA: one stream ("lane") per copying thread, each with a ring of blocks.
//!
//! Thread `t` stages its pieces on lane `t`. The lanes first wait for the work already on the
//! caller's stream (an event, no host wait), and the caller's stream then waits for every
//! lane, so the upload is ordered on the caller's stream exactly as if enqueued there. A lane
//! leases `depth` blocks once and cycles through them (double buffering by default): before a
//! block is refilled, the event recorded after its last copy is waited for, so a piece costs a
//! `memcpy`, a copy call and an event record, and no pool traffic. The blocks go back to the
//! pool fenced by their last copies' events: reused only after those DMAs complete.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use longshore_host::PoolBuffer;

use super::{CuEvent, CuStream, CudaDevice, err, htod};
use crate::backend::stage::{FirstError, Plan};
use crate::error::{Result, TransferError};

/// `n` lanes on `dev`.
pub(crate) fn new_lanes(dev: &Arc<CudaDevice>, n: usize) -> Result<Vec<CuStream>> {
    (0..n)
        .map(|_| CuStream::new(dev, 0, crate::StreamPriority::Normal))
        .collect()
}

/// Stages `src` to device address `dst` on `lanes`, ordered on `stream`.
pub(crate) fn upload(
    lanes: &[CuStream],
    plan: &Plan<'_>,
    stream: &CuStream,
    src: &[u8],
    dst: u64,
) -> Result<()> {
    let dev = &stream.dev;
    let depth = plan.depth;
    dev.bind()?;
    let start = stream.record()?;
    let next = AtomicUsize::new(0);
    let failure = FirstError::default();
    let fail = |e: TransferError| failure.record(e);
    let lane_err = |call: &'static str, e, what: String| err(call, e, dev.ordinal, what);
    // One lane's share: its pieces, then the event the caller's stream waits for.
    let work = |lane: &CuStream| -> Option<CuEvent> {
        let ring = (|| -> Result<Vec<(PoolBuffer, CuEvent, bool)>> {
            dev.bind()?;
            lane.stream
                .wait(start.raw())
                .map_err(|e| lane_err("cuStreamWaitEvent", e, "ordering a staging lane".into()))?;
            (0..depth)
                .map(|_| {
                    Ok((
                        plan.pool.alloc(plan.block_bytes)?,
                        CuEvent::create(dev)?,
                        false,
                    ))
                })
                .collect()
        })();
        let mut ring = match ring {
            Ok(r) => r,
            Err(e) => {
                fail(e);
                return None;
            }
        };
        let mut k = 0usize;
        while !failure.stopped() {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= plan.pieces {
                break;
            }
            let (block, ev, used) = &mut ring[k % depth];
            k += 1;
            let range = plan.range(i, src.len());
            let begin = range.start;
            let part = &src[range];
            let staged = (|| {
                if *used {
                    ev.synchronize()?;
                }
                block.as_bytes_mut()[..part.len()].copy_from_slice(part);
                // SAFETY: `dst + begin .. + part.len()` lies in the destination buffer (the
                // caller checked the whole range) in this lane's context. The block is not
                // written again before `ev`, recorded just below, has completed (waited for
                // above on its next turn), and goes back to the pool with `ev` as its fence,
                // so it is neither reused nor freed under the copy.
                unsafe {
                    htod(
                        &lane.stream,
                        dst + begin as u64,
                        block.as_bytes().as_ptr(),
                        part.len(),
                    )
                }
                .map_err(|e| {
                    lane_err(
                        "cuMemcpyHtoDAsync",
                        e,
                        format!("staging {} bytes at offset {begin}", part.len()),
                    )
                })?;
                *used = true; // a copy is in flight from here on
                ev.rerecord(&lane.stream, plan.stream_id).inspect_err(|_| {
                    // `ev` still marks the block's previous copy and would let the block go
                    // before this one: wait for the lane instead.
                    let _ = lane.stream.synchronize();
                })
            })();
            if let Err(e) = staged {
                fail(e);
                break;
            }
        }
        // The blocks go back fenced by their last copies' events. Even after a failure, the
        // caller's stream must not run ahead of what this lane has enqueued.
        let done = CuEvent::record(dev, &lane.stream, plan.stream_id);
        for (mut block, ev, used) in ring {
            if used {
                block.record_fence(Arc::new(ev));
            }
            drop(block);
        }
        match done {
            Ok(done) => Some(done),
            Err(e) => {
                // Nothing can order the caller's stream after this lane: wait here.
                let _ = lane.stream.synchronize();
                fail(e);
                None
            }
        }
    };
    tracing::trace!(target: "longshore::transfer", stream_id = plan.stream_id, bytes = src.len(), piece = plan.piece, pieces = plan.pieces, lanes = plan.threads, "staged upload");
    let done: Mutex<Vec<CuEvent>> = Mutex::new(Vec::with_capacity(plan.threads));
    plan.run(|t| {
        if let Some(ev) = work(&lanes[t]) {
            done.lock().unwrap_or_else(|p| p.into_inner()).push(ev);
        }
    });
    for ev in done.into_inner().unwrap_or_else(|p| p.into_inner()) {
        if let Err(e) = stream.stream.wait(ev.raw()) {
            // Nothing else can order the caller's stream after this lane: wait here.
            tracing::error!(target: "longshore::transfer", error = ?e.0, "cuStreamWaitEvent on a staging lane failed; waiting on the host");
            let _ = ev.synchronize();
            fail(lane_err(
                "cuStreamWaitEvent",
                e,
                "joining a staging lane".into(),
            ));
        }
    }
    failure.into_result()
}
