//! The wire on a stream of lines (stdio, or any byte stream): a bounded
//! line reader, and the loop that answers what the decision refuses and
//! hands the rest to rmcp.

use std::io;
use std::io::Write as _;

use rmcp::service::QuitReason;
use rmcp::{ServerHandler, ServiceExt as _};
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::sync::mpsc;

use super::{Inspected, inspect, log, too_large};

// ---------------------------------------------------------------------------
// stdio (any line stream).

/// One line of input.
enum Line {
    /// A whole line, with its line ending (none at the end of input).
    Whole(Vec<u8>),
    /// A line over the limit: its first bytes (the rest is skipped).
    TooLong(Vec<u8>),
}

/// Reads lines without ever keeping more than the limit of one: the rest
/// of a longer line is read and dropped up to its newline.
struct LineReader<R> {
    input: BufReader<R>,
    line: Vec<u8>,
    limit: usize,
    skipping: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    fn new(input: R, limit: usize) -> Self {
        Self { input: BufReader::new(input), line: Vec::new(), limit, skipping: false }
    }

    async fn next(&mut self) -> io::Result<Option<Line>> {
        // A line of `limit` bytes may still end in "\r\n".
        let most = self.limit.saturating_add(1);
        loop {
            let available = self.input.fill_buf().await?;
            if available.is_empty() {
                return Ok((!self.skipping && !self.line.is_empty())
                    .then(|| Line::Whole(std::mem::take(&mut self.line))));
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let taken = newline.map_or(available.len(), |at| at + 1);
            let content = newline.unwrap_or(available.len());
            let line = if self.skipping {
                self.skipping = newline.is_none();
                None
            } else if self.line.len().saturating_add(content) > most {
                let room = most.saturating_sub(self.line.len());
                self.line.extend_from_slice(&available[..room]);
                self.skipping = newline.is_none();
                Some(Line::TooLong(std::mem::take(&mut self.line)))
            } else {
                self.line.extend_from_slice(&available[..taken]);
                newline.map(|_| Line::Whole(std::mem::take(&mut self.line)))
            };
            self.input.consume(taken);
            if line.is_some() {
                return Ok(line);
            }
        }
    }
}

/// Serves `handler` over a stream of newline-delimited JSON-RPC messages
/// (MCP's stdio transport: `tokio::io::stdin()` and `stdout()`, or
/// `rmcp::transport::stdio_pipes()`), with every line read by the wire
/// first (see the module's documentation), no line longer than `limit`
/// bytes kept ([`DEFAULT_MAX_MESSAGE_BYTES`](super::DEFAULT_MAX_MESSAGE_BYTES)
/// is rmcp's HTTP limit).
///
/// rmcp serves the lines that pass through an in-memory pipe; its answers
/// and the wire's own are written to `output` by one writer, a whole line
/// at a time. Blank lines are skipped. Ends when `input` ends (rmcp's input
/// is closed then, so it ends too) or when rmcp ends, with rmcp's reason.
///
/// # Errors
///
/// When the MCP handshake fails (also when `input` ends before it), the
/// serving task panics, or writing to `output` fails.
pub async fn serve_lines<H, R, W>(
    handler: H,
    input: R,
    output: W,
    limit: usize,
) -> io::Result<QuitReason>
where
    H: ServerHandler,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    const PIPE_BYTES: usize = 64 * 1024;
    let (to_rmcp, rmcp_input) = tokio::io::duplex(PIPE_BYTES);
    let (rmcp_output, from_rmcp) = tokio::io::duplex(PIPE_BYTES);
    let (lines, queue) = mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(write_lines(queue, output));
    let pump = tokio::spawn(pump_lines(from_rmcp, lines.clone()));
    let mut server = tokio::spawn(async move {
        let running = handler.serve((rmcp_input, rmcp_output)).await.map_err(io::Error::other)?;
        running.waiting().await.map_err(io::Error::other)
    });
    let served = tokio::select! {
        () = read_lines(input, limit, to_rmcp, lines) => server.await,
        served = &mut server => served,
    };
    let served = served.map_err(io::Error::other).and_then(|served| served);
    // rmcp's output closes once it has ended; then the writer's queue does.
    let _ = pump.await;
    let written = writer.await.map_err(io::Error::other).and_then(|written| written);
    let reason = served?;
    written?;
    Ok(reason)
}

async fn read_lines<R: AsyncRead + Unpin>(
    input: R,
    limit: usize,
    mut to_rmcp: tokio::io::DuplexStream,
    answers: mpsc::Sender<Vec<u8>>,
) {
    let mut reader = LineReader::new(input, limit);
    loop {
        let inspected = match reader.next().await {
            Ok(Some(Line::Whole(line))) if line.iter().all(u8::is_ascii_whitespace) => continue,
            Ok(Some(Line::Whole(line))) => inspect(&line, limit),
            Ok(Some(Line::TooLong(prefix))) => too_large(&prefix, limit),
            Ok(None) => return,
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "verified-tools mcp: reading the input failed: {e}"
                );
                return;
            }
        };
        match inspected {
            Inspected::Forward(mut message) => {
                message.push(b'\n');
                if to_rmcp.write_all(&message).await.is_err() {
                    return;
                }
            }
            Inspected::Answer(answer) => {
                log(&answer);
                if let Some(mut reply) = answer.reply {
                    reply.push(b'\n');
                    if answers.send(reply).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Hands rmcp's output to the writer a whole line at a time, so that the
/// wire's own answers fall between lines, never inside one.
async fn pump_lines(from_rmcp: tokio::io::DuplexStream, lines: mpsc::Sender<Vec<u8>>) {
    let mut from_rmcp = BufReader::new(from_rmcp);
    loop {
        let mut line = Vec::new();
        match from_rmcp.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if !line.ends_with(b"\n") {
            line.push(b'\n');
        }
        if lines.send(line).await.is_err() {
            return;
        }
    }
}

async fn write_lines<W: AsyncWrite + Unpin>(
    mut queue: mpsc::Receiver<Vec<u8>>,
    mut output: W,
) -> io::Result<()> {
    while let Some(line) = queue.recv().await {
        output.write_all(&line).await?;
        // Flushing per line would cost a write per message under load;
        // flushing when nothing is waiting still never holds an answer back.
        if queue.is_empty() {
            output.flush().await?;
        }
    }
    output.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::wire::{Answer, WireError};

    #[tokio::test]
    async fn the_line_reader_keeps_no_more_than_the_limit() {
        let limit = 8;
        let input: &[u8] =
            b"12345678\n12345678\r\n123456789\nthis one is far too long\nab\r\n\ntail";
        let mut reader = LineReader::new(input, limit);
        let mut lines = Vec::new();
        while let Some(line) = reader.next().await.unwrap() {
            assert!(reader.line.capacity() <= 64, "nothing long is kept");
            lines.push(match line {
                Line::Whole(line) => format!("whole {}", String::from_utf8_lossy(&line)),
                Line::TooLong(start) => {
                    assert!(start.len() <= limit + 1);
                    format!("too long {}", String::from_utf8_lossy(&start))
                }
            });
        }
        assert_eq!(
            lines,
            [
                "whole 12345678\n",
                "whole 12345678\r\n",
                "whole 123456789\n",
                "too long this one ",
                "whole ab\r\n",
                "whole \n",
                "whole tail",
            ]
        );
        // The line of 9 bytes is over a limit of 8 (only a "\r" may follow).
        assert!(matches!(
            inspect(b"123456789\n", limit),
            Inspected::Answer(Answer { problem: WireError::TooLarge { limit: 8 }, .. })
        ));
    }

    #[tokio::test]
    async fn the_line_reader_skips_a_long_line_across_reads() {
        let (mut client, server) = tokio::io::duplex(16);
        let writer = tokio::spawn(async move {
            client.write_all(&[b'x'; 1000]).await.unwrap();
            client.write_all(b"\n{}\n").await.unwrap();
        });
        let mut reader = LineReader::new(server, 32);
        assert!(
            matches!(reader.next().await.unwrap(), Some(Line::TooLong(start)) if start.len() == 33)
        );
        assert!(matches!(reader.next().await.unwrap(), Some(Line::Whole(line)) if line == b"{}\n"));
        assert!(reader.next().await.unwrap().is_none());
        writer.await.unwrap();
    }
}
