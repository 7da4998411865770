//! Deterministic inputs of the `megatest` program, shared with the tests that
//! check its output against sequential computations.

/// SplitMix64 of `seed` and `i`: the contribution generator.
pub fn draw(seed: u64, i: u64) -> u64 {
    let mut z = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Element `i`'s integer contribution.
pub fn int_of(seed: u64, i: u64) -> i64 {
    draw(seed, i) as i64
}

/// Element `i`'s float contribution, in [-1000, 1000).
pub fn float_of(seed: u64, i: u64) -> f64 {
    (draw(seed ^ 0xF10A7, i) >> 11) as f64 / (1u64 << 53) as f64 * 2000.0 - 1000.0
}

/// Element `i`'s boolean contribution.
pub fn bool_of(seed: u64, i: u64) -> bool {
    draw(seed ^ 0xB001, i) % 5 != 0
}

/// Length of the message chain element `i` starts in the quiescence test.
pub fn chain_len(seed: u64, i: u64) -> u64 {
    draw(seed ^ 0xC4A1, i) % 40
}

/// The element a random walk of the migration test visits at `hop`.
pub fn walk_target(salt: u64, hop: u64, n: u64) -> u64 {
    draw(salt, hop) % n
}

/// The value a walk's token carries at `hop`.
pub fn walk_value(salt: u64, hop: u64) -> u64 {
    draw(salt, hop + 1000)
}

/// What one walker reports: a digest of its index, token count and value sum.
pub fn walk_digest(index: u64, count: u64, sum: u64) -> u64 {
    draw(draw(index, count), sum)
}

/// The migration test's expected total digest, computed sequentially.
pub fn walk_expectation(seed: u64, n: u64, chains: u64, len: u64) -> u64 {
    let mut count = vec![0u64; n as usize];
    let mut sum = vec![0u64; n as usize];
    for i in 0..n {
        for t in 0..chains {
            let salt = draw(seed, i * chains + t);
            for hop in 0..len {
                let at = walk_target(salt, hop, n) as usize;
                count[at] += 1;
                sum[at] = sum[at].wrapping_add(walk_value(salt, hop));
            }
        }
    }
    (0..n).fold(0u64, |acc, i| {
        acc.wrapping_add(walk_digest(i, count[i as usize], sum[i as usize]))
    })
}

/// What each element of the readonly test contributes: a digest of both readonly values.
pub fn readonly_digest(table: &[u64], name: &str) -> u64 {
    table
        .iter()
        .fold(draw(name.len() as u64, 0), |a, &b| draw(a, b))
}

/// The readonly test's table for `seed`.
pub fn readonly_table(seed: u64) -> Vec<u64> {
    (0..1000).map(|i| draw(seed, i)).collect()
}

/// Expected results of `megatest reduce --seed S --elems N` (vectors printed without spaces).
pub fn reduce_expectations(seed: u64, n: u64) -> Vec<(String, String)> {
    let ints: Vec<i64> = (0..n).map(|i| int_of(seed, i)).collect();
    let floats: Vec<f64> = (0..n).map(|i| float_of(seed, i)).collect();
    let bools: Vec<bool> = (0..n).map(|i| bool_of(seed, i)).collect();
    let sum = ints.iter().fold(0i64, |a, &b| a.wrapping_add(b));
    let xor = ints.iter().fold(0u64, |a, &b| a ^ b as u64);
    let fmax = floats.iter().cloned().fold(f64::MIN, f64::max);
    let fmin = floats.iter().cloned().fold(f64::MAX, f64::min);
    let vsum: Vec<i64> = vec![sum, sum.wrapping_neg(), (0..n as i64).sum()];
    let all = bools.iter().all(|&b| b);
    let any = bools.iter().any(|&b| b);
    let mut sorted: Vec<u64> = (0..n).map(|i| draw(seed, i) % 1000).collect();
    sorted.sort_unstable();
    vec![
        ("sum_i64".into(), sum.to_string()),
        ("xor_u64".into(), xor.to_string()),
        ("max_f64".into(), format!("{fmax:?}")),
        ("min_f64".into(), format!("{fmin:?}")),
        ("vsum_i64".into(), format!("{vsum:?}").replace(' ', "")),
        ("and".into(), all.to_string()),
        ("or".into(), any.to_string()),
        ("count_i32".into(), (n as i32).to_string()),
        (
            "custom_sorted".into(),
            format!("{sorted:?}").replace(' ', ""),
        ),
        ("element_cb".into(), sum.to_string()),
        (
            "broadcast_cb".into(),
            sum.wrapping_mul(n as i64).to_string(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_differ_and_repeat() {
        assert_eq!(draw(1, 2), draw(1, 2));
        assert_ne!(draw(1, 2), draw(1, 3));
        assert!((-1000.0..1000.0).contains(&float_of(9, 9)));
        assert_eq!(reduce_expectations(3, 5).len(), 11);
    }
}
