//! Checkpoint averaging (`ferrotrain translate --average N`).

use super::safetensors::Named;

/// The element-wise mean of several models' weights (checkpoint averaging). Every model must
/// hold the same tensor names, in the same order, with the same shapes.
pub fn average_weights(models: Vec<Named>) -> Result<Named, String> {
    let count = models.len();
    let mut models = models.into_iter();
    let mut sum = models.next().ok_or("no weights to average")?;
    for (i, other) in models.enumerate() {
        if other.len() != sum.len() {
            return Err(format!(
                "model {} holds {} tensors, model 0 holds {}",
                i + 1,
                other.len(),
                sum.len()
            ));
        }
        for ((name, acc), (other_name, t)) in sum.iter_mut().zip(&other) {
            if name != other_name || acc.size() != t.size() {
                return Err(format!(
                    "model {} holds {other_name} {:?} where model 0 holds {name} {:?}",
                    i + 1,
                    t.size(),
                    acc.size()
                ));
            }
            *acc += t;
        }
    }
    if count > 1 {
        for (_, acc) in sum.iter_mut() {
            *acc /= count as f64;
        }
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use tch::Tensor;

    use super::*;

    #[test]
    fn averaging_weights_takes_the_element_wise_mean_of_matching_tensors() {
        let model = |w: &[f32], b: f32| -> Named {
            vec![
                ("w".into(), Tensor::from_slice(w)),
                ("b".into(), Tensor::from_slice(&[b])),
            ]
        };
        let avg = average_weights(vec![
            model(&[1.0, 2.0], 3.0),
            model(&[3.0, 6.0], 5.0),
            model(&[5.0, 1.0], 1.0),
        ])
        .unwrap();
        assert_eq!(Vec::<f32>::try_from(&avg[0].1).unwrap(), [3.0, 3.0]);
        assert_eq!(Vec::<f32>::try_from(&avg[1].1).unwrap(), [3.0]);
        let single = average_weights(vec![model(&[1.0, 2.0], 3.0)]).unwrap();
        assert_eq!(Vec::<f32>::try_from(&single[0].1).unwrap(), [1.0, 2.0]);

        let renamed = vec![("v".to_string(), Tensor::from_slice(&[0f32, 0.0]))];
        let err = average_weights(vec![model(&[1.0, 2.0], 3.0), renamed]).unwrap_err();
        assert!(err.contains("1 tensors"), "{err}");
        let reshaped = model(&[1.0, 2.0, 3.0], 0.0);
        let err = average_weights(vec![model(&[1.0, 2.0], 3.0), reshaped]).unwrap_err();
        assert!(err.contains("w [3]"), "{err}");
        assert!(average_weights(Vec::new()).is_err());
    }
}
