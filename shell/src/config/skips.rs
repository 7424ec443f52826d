//! `--skip-input` and `--skip-batch`: input, or a destination batch, an
//! operator gives up, as a stop message names it.

use skippr_core::rules::check_stream_name;

/// Input an operator gives up (`--skip-input`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputSkip {
    pub stream: String,
    pub partition: u32,
    pub at: u64,
    pub next: u64,
}

fn input_skip(text: &str) -> Result<InputSkip, String> {
    let bad = |why: &str| {
        format!(
            "--skip-input {text:?}: {why}; give STREAM:PARTITION:AT..NEXT exactly as the refusal message prints it \
             (for example events:3:1024..5120)"
        )
    };
    let mut parts = text.splitn(3, ':');
    let (Some(stream), Some(partition), Some(range)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad("it has fewer than three parts"));
    };
    check_stream_name(stream).map_err(|e| bad(&format!("the stream name is not one a source may use ({e})")))?;
    let partition = partition.parse().map_err(|_| bad("the partition is not a number"))?;
    let (at, next) = range.split_once("..").ok_or_else(|| bad("the positions are not AT..NEXT"))?;
    let (Ok(at), Ok(next)) = (at.parse::<u64>(), next.parse::<u64>()) else {
        return Err(bad("the positions are not numbers"));
    };
    if at >= next {
        return Err(bad("NEXT must be past AT"));
    }
    Ok(InputSkip { stream: stream.into(), partition, at, next })
}

/// Every `--skip-input`, each once, none overlapping another.
pub(super) fn input_skips(texts: &[String]) -> Result<Vec<InputSkip>, String> {
    let mut skips = texts.iter().map(|s| input_skip(s)).collect::<Result<Vec<_>, _>>()?;
    skips.sort_by_key(|k| (k.stream.clone(), k.partition, k.at, k.next));
    skips.dedup();
    for pair in skips.windows(2) {
        if (&pair[0].stream, pair[0].partition) == (&pair[1].stream, pair[1].partition) && pair[1].at < pair[0].next {
            return Err(format!(
                "--skip-input gives {}:{}:{}..{} and {}..{}, which overlap; give each refused input once",
                pair[0].stream, pair[0].partition, pair[0].at, pair[0].next, pair[1].at, pair[1].next
            ));
        }
    }
    Ok(skips)
}

/// A destination batch an operator gives up (`--skip-batch`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchSkip {
    pub stream: String,
    pub seq: u64,
}

/// Every `--skip-batch`, each once.
pub(super) fn batch_skips(texts: &[String]) -> Result<Vec<BatchSkip>, String> {
    let mut skips = Vec::new();
    for text in texts {
        let bad = |why: &str| {
            format!(
                "--skip-batch {text:?}: {why}; give STREAM:SEQ exactly as the stop message prints it (for example \
                 orders:41)"
            )
        };
        let (stream, seq) = text.rsplit_once(':').ok_or_else(|| bad("it is not STREAM:SEQ"))?;
        check_stream_name(stream).map_err(|e| bad(&format!("the stream name is not one a source may use ({e})")))?;
        let seq = seq.parse().map_err(|_| bad("the batch number is not a number"))?;
        skips.push(BatchSkip { stream: stream.into(), seq });
    }
    skips.sort_by(|a, b| (&a.stream, a.seq).cmp(&(&b.stream, b.seq)));
    skips.dedup();
    Ok(skips)
}

/// `--skip-reason`, checked; `None` leaves each skip its default, which
/// names the option that gave it.
pub(super) fn skip_reason(reason: Option<&str>) -> Result<Option<String>, String> {
    let Some(reason) = reason else { return Ok(None) };
    if reason.len() > skippr_core::SKIP_REASON_BYTES_MAX {
        return Err(format!(
            "--skip-reason is {} bytes; keep it under {}",
            reason.len(),
            skippr_core::SKIP_REASON_BYTES_MAX
        ));
    }
    Ok(Some(reason.into()))
}
