//! The `train` example learns: on a small configuration the last epoch's loss is well below the
//! first epoch's and accuracy is well above chance, on the Cpu device (always) and on CUDA
//! (skipped without a usable GPU, required with LONGSHORE_REQUIRE_CUDA=1).

use longshore::transfer::Device;
use longshore_examples::train::{CLASSES, TrainConfig, train};
use longshore_ops as ops;

fn small_config(tag: &str) -> TrainConfig {
    let dir =
        std::env::temp_dir().join(format!("longshore-train-test-{tag}-{}", std::process::id()));
    let mut cfg = TrainConfig::new(dir);
    cfg.samples = 4096;
    cfg.epochs = 4;
    cfg.batch_size = 128;
    cfg.hidden = 64;
    cfg.workers = 2;
    cfg.seed = 3;
    cfg.progress = false;
    cfg
}

fn check_learns(device: &Device, tag: &str) {
    let cfg = small_config(tag);
    let s = train(&cfg, device).unwrap();
    let _ = std::fs::remove_dir_all(&cfg.data_dir);
    eprintln!(
        "{tag}: loss {:?}, accuracy {:?}, wait {:.3}",
        s.epoch_loss, s.epoch_accuracy, s.wait_fraction
    );
    assert_eq!(s.epoch_loss.len(), 4);
    assert!(
        s.epoch_loss.iter().all(|l| l.is_finite()),
        "{:?}",
        s.epoch_loss
    );
    assert!(
        s.final_loss() < 0.6 * s.first_loss(),
        "{tag}: loss did not fall enough: {:?}",
        s.epoch_loss
    );
    let chance = 1.0 / CLASSES as f64;
    assert!(
        s.final_accuracy() > chance + 0.5,
        "{tag}: accuracy {:?}",
        s.epoch_accuracy
    );
    assert!((0.0..=1.0).contains(&s.wait_fraction));
    assert!(s.samples_per_sec > 0.0);
    assert_eq!(
        s.pool_bytes_outstanding, 0,
        "every batch goes back to the pinned pool once training ends"
    );
    assert!(s.pool_peak_bytes_held > 0, "the batches came from the pool");
}

#[test]
fn cpu_training_loss_falls() {
    check_learns(&Device::cpu(), "cpu");
}

#[test]
fn cuda_training_loss_falls() {
    let gpu = Device::cuda(0).and_then(|d| ops::available(&d).map(|()| d));
    if let Some(d) = longshore_testing::cuda_or_skip("cuda_training_loss_falls", gpu) {
        check_learns(&d, "cuda");
    }
}
