//! The baseline of `benches/readback.sh`: a plain consumer (no checks, no
//! stamps, no formatting) that writes every payload of a JetStream
//! stream's subject filter to stdout and ends when nothing is pending.
//!
//! Usage: `plain-consumer URL STREAM FILTER [FROM [TO [BATCH_BYTES]]]`.
//! With only the first three, the client's own ordered consumer (its
//! default pulls: 500 messages, not bounded in bytes). `FROM` (a stream
//! sequence, 0 for the first) and `TO` (the sequence to stop before, 0
//! for the end) read one range, as one of several readers over disjoint
//! ranges would; `BATCH_BYTES` (0 for the client's default) makes it a
//! pull consumer asking for that many bytes per pull (256 messages at
//! most), to see what the pull size changes. The benchmark uses the
//! ranges to measure what the server delivers to two consumers at once.

use std::io::Write;

use async_nats::jetstream::consumer::pull::{self, OrderedConfig};
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy};
use futures_util::StreamExt;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: plain-consumer URL STREAM FILTER [FROM [TO [BATCH_BYTES]]]";
    let (Some(url), Some(stream), Some(filter)) = (a.get(1), a.get(2), a.get(3)) else {
        return Err(usage.into());
    };
    let num = |i: usize| -> Result<u64, Box<dyn std::error::Error>> {
        Ok(a.get(i).map(|v| v.parse::<u64>()).transpose()?.unwrap_or(0))
    };
    let (from, to, batch) = (num(4)?, num(5)?, usize::try_from(num(6)?)?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(url.as_str()).await?);
        let s = js.get_stream(stream.as_str()).await?;
        let deliver_policy = match from {
            0 => DeliverPolicy::All,
            start_sequence => DeliverPolicy::ByStartSequence { start_sequence },
        };
        let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
        if batch == 0 {
            let c = s
                .create_consumer(OrderedConfig {
                    filter_subject: filter.clone(),
                    deliver_policy,
                    ..Default::default()
                })
                .await?;
            if c.cached_info().num_pending == 0 {
                return Ok(());
            }
            let msgs = c.messages().await?.map(|m| m.map_err(|e| e.to_string()));
            return copy(msgs, to, &mut out).await;
        }
        let c = s
            .create_consumer(pull::Config {
                filter_subject: filter.clone(),
                ack_policy: AckPolicy::None,
                deliver_policy,
                memory_storage: true,
                ..Default::default()
            })
            .await?;
        if c.cached_info().num_pending == 0 {
            return Ok(());
        }
        let msgs = c
            .stream()
            .max_bytes_per_batch(batch)
            .max_messages_per_batch(256)
            .messages()
            .await?
            .map(|m| m.map_err(|e| e.to_string()));
        copy(msgs, to, &mut out).await
    })
}

/// Writes each message's payload until one at or past `to` (0: none) or
/// the last pending.
async fn copy<S>(
    mut msgs: S,
    to: u64,
    out: &mut impl Write,
) -> Result<(), Box<dyn std::error::Error>>
where
    S: futures_util::Stream<Item = Result<async_nats::jetstream::Message, String>> + Unpin,
{
    while let Some(m) = msgs.next().await {
        let m = m?;
        let info = m.info().map_err(|e| e.to_string())?;
        if to != 0 && info.stream_sequence >= to {
            break;
        }
        out.write_all(&m.message.payload)?;
        if info.pending == 0 || (to != 0 && info.stream_sequence + 1 >= to) {
            break;
        }
    }
    out.flush()?;
    Ok(())
}
