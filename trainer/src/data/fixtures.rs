//! What the data tests build from: configs from YAML, files written into a test's
//! directory (plain or gzip), the data error a call must return, and a small
//! English/German-like corpus with shared words, so a BPE has something to merge.

use std::io::Write;
use std::path::Path;

use ferrotrain_api::TrainerConfig;

use crate::error::{Result, TrainError};

pub(super) fn config(yaml: &str) -> TrainerConfig {
    TrainerConfig::from_yaml(yaml, "test").unwrap()
}

pub(super) fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

pub(super) fn write_gz(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&path).unwrap(),
        flate2::Compression::fast(),
    );
    gz.write_all(text.as_bytes()).unwrap();
    gz.finish().unwrap();
    path.display().to_string()
}

pub(super) fn data_error(result: Result<impl Sized>) -> String {
    match result {
        Err(TrainError::Data(message)) => message.to_string(),
        Err(other) => panic!("expected a data error, got {other:?}"),
        Ok(_) => panic!("expected a data error, got Ok"),
    }
}

// A small English/German-like corpus with shared words, so a BPE has something to merge.
pub(super) const EN: &[&str] = &[
    "A man rides a bike down the street.",
    "Two dogs play in the green grass.",
    "A woman in a red dress sings on a stage.",
    "Children play football in the park.",
    "A man and a woman walk their dog.",
    "The street is full of people.",
    "A boy jumps into the water.",
    "Three men are working on a roof.",
];
pub(super) const DE: &[&str] = &[
    "Ein Mann fährt mit dem Fahrrad die Straße hinunter.",
    "Zwei Hunde spielen im grünen Gras.",
    "Eine Frau in einem roten Kleid singt auf einer Bühne.",
    "Kinder spielen Fußball im Park.",
    "Ein Mann und eine Frau gehen mit ihrem Hund spazieren.",
    "Die Straße ist voller Menschen.",
    "Ein Junge springt ins Wasser.",
    "Drei Männer arbeiten auf einem Dach.",
];
