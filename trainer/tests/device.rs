//! A pod that was given GPUs never trains on the CPU by accident: with
//! FERROTRAIN_EXPECT_GPUS set (the operator sets it from gpusPerReplica) and no CUDA, `device:
//! auto` exits 2 with a message; without it the same config trains on the CPU and says so.

mod common;

use common::{copy_config, run_command, write};

#[test]
fn expected_gpus_without_cuda_is_exit_2_and_the_device_is_logged() {
    if tch::Cuda::is_available() {
        return; // a GPU machine: auto rightly picks it
    }
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "job.yaml", &copy_config(2, 0, "device: auto\n"));
    let ckpt = dir.path().join("runs");

    let out = run_command(&config, &ckpt)
        .env("FERROTRAIN_EXPECT_GPUS", "2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("refusing to train on the CPU"), "{stderr}");
    assert!(stderr.contains("FERROTRAIN_EXPECT_GPUS"), "{stderr}");

    let out = run_command(&config, &ckpt)
        .env_remove("FERROTRAIN_EXPECT_GPUS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("device Cpu; libtorch 2."), "{stderr}");
}
