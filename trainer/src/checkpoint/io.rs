//! Durable writes (a file or a directory fsynced before anyone relies on it) and the
//! module's I/O errors, naming what was done to which path.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use crate::error::Result;
use crate::error::{Reason, TrainError};

pub(super) fn write_synced(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<u64> {
    let file = File::create(path).map_err(|e| io_err("creating", path, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    body(&mut w).map_err(|e| io_err("writing", path, e))?;
    let file = w
        .into_inner()
        .map_err(|e| io_err("writing", path, e.into_error()))?;
    file.sync_all().map_err(|e| io_err("fsyncing", path, e))?;
    Ok(file
        .metadata()
        .map_err(|e| io_err("reading", path, e))?
        .len())
}

pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("fsyncing", dir, e))
}

pub(super) fn io_err(what: &str, path: &Path, e: std::io::Error) -> TrainError {
    TrainError::Other(Reason::caused(
        format!("checkpoint: {what} {}", path.display()),
        e,
    ))
}
