//! The baseline of `benches/readback.sh`: a plain ordered consumer (the
//! client's own, no checks, no stamps, no formatting) that writes every
//! payload of a JetStream stream's subject filter to stdout and ends when
//! nothing is pending. Usage: `plain-consumer URL STREAM FILTER`.

use std::io::Write;

use async_nats::jetstream::consumer::pull::OrderedConfig;
use futures_util::StreamExt;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    let [_, url, stream, filter] = a.as_slice() else {
        return Err("usage: plain-consumer URL STREAM FILTER".into());
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(url.as_str()).await?);
        let s = js.get_stream(stream.as_str()).await?;
        let c = s
            .create_consumer(OrderedConfig {
                filter_subject: filter.clone(),
                ..Default::default()
            })
            .await?;
        if c.cached_info().num_pending == 0 {
            return Ok(());
        }
        let mut msgs = c.messages().await?;
        let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
        while let Some(m) = msgs.next().await {
            let m = m?;
            out.write_all(&m.message.payload)?;
            if m.info().map_err(|e| e.to_string())?.pending == 0 {
                break;
            }
        }
        out.flush()?;
        Ok(())
    })
}
