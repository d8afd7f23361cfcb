//! Mends the HTTP/2 `:authority` that kubelet's plugin watcher sends, so h2 takes the call.
//!
//! kubelet v1.37.2's plugin watcher (`pkg/kubelet/pluginmanager/operationexecutor`) dials
//! a registration socket with the socket's path as the gRPC target and no authority set,
//! so grpc-go sends the path, percent-encoded, as `:authority`:
//! `%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.vgpu-shim.io-reg.sock`. The `http`
//! crate refuses a `%` in a host, so h2 resets the stream with PROTOCOL_ERROR before
//! tonic sees the call, and the DRA driver never registers. (The device manager and the
//! DRA plugin manager send `localhost`; h2 has no switch for this.)
//!
//! [`mend`] puts every connection to a socket served here through a pump: the client's
//! header blocks are decoded (HPACK, with the client's dynamic table kept), an
//! `:authority` that is no URI authority becomes `localhost` (what grpc-go sends for a
//! `unix:` target), and each block is encoded again as plain literals, never indexed,
//! so the server's decoder never depends on what the client indexed. Every other frame
//! passes unchanged, both ways. Cost: one decode and encode of each request's header
//! block (a few hundred bytes) and one copy of every byte; these sockets carry a few
//! calls a minute.

use std::io;

use loona_hpack::Decoder;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::UnixStream;

/// The client's connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame every HTTP/2 peer takes (SETTINGS_MAX_FRAME_SIZE's floor).
const MAX_FRAME: usize = 16_384;
/// A header block larger than this ends the connection (h2's own limit is 16 KiB of
/// decoded headers by default).
const MAX_BLOCK: usize = 1 << 20;
/// The dynamic table size the client may use: h2 servers advertise none, so the
/// protocol's default holds.
const TABLE_SIZE: usize = 4096;
/// What stands in for an authority h2 refuses.
const LOCALHOST: &[u8] = b"localhost";

/// Why a connection was ended.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MendError {
    /// A frame arrived that HTTP/2 does not allow here.
    #[error("HTTP/2 protocol error from the client: {0}")]
    Protocol(&'static str),
    /// The client's header block does not decode.
    #[error("HPACK: {0}")]
    Hpack(String),
}

/// A header block that waits for its CONTINUATION frames.
struct Block {
    stream: u32,
    /// The HEADERS frame's flags.
    flags: u8,
    /// The HEADERS frame's priority fields, kept as they came.
    priority: Option<[u8; 5]>,
    /// The fragments so far.
    fragments: Vec<u8>,
}

/// The client side of one connection: its HPACK state and a header block in progress.
pub struct Mender {
    decoder: Decoder<'static>,
    pending: Option<Block>,
}

impl Default for Mender {
    fn default() -> Mender {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        Mender {
            decoder,
            pending: None,
        }
    }
}

/// A frame's 9-byte head: length, type, flags, stream.
fn head(length: usize, kind: u8, flags: u8, stream: u32) -> [u8; 9] {
    let len = (length as u32).to_be_bytes();
    let id = (stream & 0x7fff_ffff).to_be_bytes();
    [
        len[1], len[2], len[3], kind, flags, id[0], id[1], id[2], id[3],
    ]
}

/// Whether the frame with this head carries (part of) a header block.
pub fn carries_headers(frame: &[u8; 9]) -> bool {
    matches!(frame[3], HEADERS | CONTINUATION)
}

/// The payload length a frame head announces.
pub fn payload_length(frame: &[u8; 9]) -> usize {
    u32::from_be_bytes([0, frame[0], frame[1], frame[2]]) as usize
}

impl Mender {
    /// Whether a header block waits for CONTINUATION frames (then every frame must be one).
    pub fn in_block(&self) -> bool {
        self.pending.is_some()
    }

    /// Takes one HEADERS or CONTINUATION frame; returns the frames to send on (none
    /// while a block waits for its CONTINUATION).
    pub fn frame(&mut self, frame: &[u8; 9], payload: &[u8]) -> Result<Vec<u8>, MendError> {
        let (kind, flags) = (frame[3], frame[4]);
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        match (kind, self.pending.as_mut()) {
            (HEADERS, None) => {
                let mut rest = payload;
                if flags & PADDED != 0 {
                    let (&pad, after) = rest
                        .split_first()
                        .ok_or(MendError::Protocol("PADDED HEADERS without a pad length"))?;
                    rest = after
                        .get(..after.len().saturating_sub(pad as usize))
                        .filter(|_| pad as usize <= after.len())
                        .ok_or(MendError::Protocol("HEADERS padding longer than the frame"))?;
                }
                let priority = if flags & PRIORITY != 0 {
                    let (fields, after) = rest
                        .split_first_chunk::<5>()
                        .ok_or(MendError::Protocol("PRIORITY HEADERS too short"))?;
                    rest = after;
                    Some(*fields)
                } else {
                    None
                };
                self.pending = Some(Block {
                    stream,
                    flags,
                    priority,
                    fragments: rest.to_vec(),
                });
            }
            (CONTINUATION, Some(block)) if block.stream == stream => {
                if block.fragments.len() + payload.len() > MAX_BLOCK {
                    return Err(MendError::Protocol("header block over 1 MiB"));
                }
                block.fragments.extend_from_slice(payload);
            }
            (CONTINUATION, _) => {
                return Err(MendError::Protocol("CONTINUATION out of its header block"));
            }
            _ => return Err(MendError::Protocol("a frame inside a header block")),
        }
        if flags & END_HEADERS == 0 {
            return Ok(Vec::new());
        }
        let Some(block) = self.pending.take() else {
            return Err(MendError::Protocol("no header block"));
        };
        let mut fields = Vec::new();
        self.decoder
            .decode_with_cb(&block.fragments, |name, value| {
                fields.push((name.into_owned(), value.into_owned()))
            })
            .map_err(|err| MendError::Hpack(format!("{err:?}")))?;
        for (name, value) in &mut fields {
            if name.as_slice() == b":authority" && !is_authority(value) {
                tracing::debug!(
                    sent = %String::from_utf8_lossy(value),
                    "an HTTP/2 :authority h2 refuses (kubelet's plugin watcher sends the socket path): taken as localhost"
                );
                *value = LOCALHOST.to_vec();
            }
        }
        Ok(header_frames(
            block.stream,
            block.flags & END_STREAM,
            block.priority,
            &encode_block(&fields),
        ))
    }
}

/// Whether h2 takes `value` as an `:authority`.
fn is_authority(value: &[u8]) -> bool {
    hyper::http::uri::Authority::try_from(value).is_ok()
}

/// The fields as HPACK literals without indexing and with new names, no Huffman code
/// (RFC 7541, 6.2.2): the decoder's dynamic table stays empty.
pub fn encode_block(fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        block.push(0x00);
        for string in [name, value] {
            // A length with a 7-bit prefix, the Huffman bit clear. Writing to a Vec
            // cannot fail.
            let _ = loona_hpack::encoder::encode_integer_into(string.len(), 7, 0, &mut block);
            block.extend_from_slice(string);
        }
    }
    block
}

/// A HEADERS frame (with CONTINUATION frames when the block is larger than a frame)
/// carrying `block`, `end_stream` and the priority fields kept.
fn header_frames(stream: u32, end_stream: u8, priority: Option<[u8; 5]>, block: &[u8]) -> Vec<u8> {
    let room = MAX_FRAME - priority.map_or(0, |p| p.len());
    let (first, mut rest) = block.split_at(block.len().min(room));
    let mut flags = end_stream | if priority.is_some() { PRIORITY } else { 0 };
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    let mut frames = Vec::with_capacity(block.len() + 32);
    let priority = priority.unwrap_or_default();
    let priority = &priority[..if flags & PRIORITY != 0 { 5 } else { 0 }];
    frames.extend_from_slice(&head(first.len() + priority.len(), HEADERS, flags, stream));
    frames.extend_from_slice(priority);
    frames.extend_from_slice(first);
    while !rest.is_empty() {
        let (part, after) = rest.split_at(rest.len().min(MAX_FRAME));
        let flags = if after.is_empty() { END_HEADERS } else { 0 };
        frames.extend_from_slice(&head(part.len(), CONTINUATION, flags, stream));
        frames.extend_from_slice(part);
        rest = after;
    }
    frames
}

/// Copies the client's bytes to the server, header blocks mended. Returns at the
/// client's end of stream.
async fn requests(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
) -> io::Result<()> {
    let mut preface = [0u8; PREFACE.len()];
    let read = read_full(from, &mut preface).await?;
    to.write_all(&preface[..read]).await?;
    if read < preface.len() {
        return Ok(());
    }
    if preface != *PREFACE {
        // Not HTTP/2 with prior knowledge: let the server answer it as it is.
        tokio::io::copy(from, to).await?;
        return Ok(());
    }
    to.flush().await?;
    let mut mender = Mender::default();
    loop {
        let mut frame = [0u8; 9];
        let read = read_full(from, &mut frame).await?;
        if read < frame.len() {
            to.write_all(&frame[..read]).await?;
            return Ok(());
        }
        let length = payload_length(&frame);
        if carries_headers(&frame) || mender.in_block() {
            if length > MAX_BLOCK {
                return Err(io::Error::other(MendError::Protocol("frame over 1 MiB")));
            }
            let mut payload = vec![0u8; length];
            from.read_exact(&mut payload).await?;
            let out = mender.frame(&frame, &payload).map_err(io::Error::other)?;
            to.write_all(&out).await?;
        } else {
            to.write_all(&frame).await?;
            let copied = tokio::io::copy(&mut (&mut *from).take(length as u64), to).await?;
            if copied < length as u64 {
                return Ok(());
            }
        }
        to.flush().await?;
    }
}

/// Reads until `buffer` is full or the stream ends; how many bytes came.
async fn read_full(from: &mut (impl AsyncRead + Unpin), buffer: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match from.read(&mut buffer[filled..]).await? {
            0 => break,
            read => filled += read,
        }
    }
    Ok(filled)
}

/// The server's end of `client`'s connection, with every request's header block
/// mended on its way (see the module). The pump runs until either side closes.
pub fn mend(client: UnixStream) -> DuplexStream {
    let (server_end, pump_end) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = tokio::io::split(pump_end);
        let up = async {
            let result = requests(&mut client_read, &mut server_write).await;
            let _ = server_write.shutdown().await;
            result
        };
        let down = async {
            let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            let _ = client_write.shutdown().await;
        };
        tokio::pin!(up, down);
        tokio::select! {
            result = &mut up => match result {
                // The client is done sending: its answers still come.
                Ok(()) => down.await,
                Err(err) => tracing::debug!(error = %err, "gRPC connection ended"),
            },
            // The server ended the connection.
            () = &mut down => {}
        }
    });
    server_end
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What grpc-go's encoder (golang.org/x/net/http2/hpack, which indexes every field)
    /// sends for kubelet's GetInfo: `:path`, `:authority` and `content-type` as literals
    /// added to the dynamic table on the first call, then referred to by index.
    fn client_blocks() -> (Vec<u8>, Vec<u8>) {
        let mut first = vec![0x83, 0x86]; // :method POST, :scheme http (static)
        for (name_index, value) in [
            (4u8, &b"/pluginregistration.Registration/GetInfo"[..]), // :path
            (
                1,
                b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.vgpu-shim.io-reg.sock",
            ), // :authority
            (31, b"application/grpc"),                               // content-type
        ] {
            first.push(0x40 | name_index);
            loona_hpack::encoder::encode_integer_into(value.len(), 7, 0, &mut first).expect("vec");
            first.extend_from_slice(value);
        }
        // Dynamic entries, newest first: content-type 62, :authority 63, :path 64.
        let second = vec![0x83, 0x86, 0x80 | 64, 0x80 | 63, 0x80 | 62];
        (first, second)
    }

    fn decoded(frames: &[u8]) -> Vec<(String, String)> {
        let frame: [u8; 9] = frames[..9].try_into().expect("head");
        assert_eq!(frame[3], HEADERS);
        assert_eq!(payload_length(&frame), frames.len() - 9, "one frame");
        Decoder::new()
            .decode(&frames[9..])
            .expect("decodes")
            .into_iter()
            .map(|(n, v)| {
                (
                    String::from_utf8(n).expect("utf8"),
                    String::from_utf8(v).expect("utf8"),
                )
            })
            .collect()
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost_on_every_call() {
        let (first, second) = client_blocks();
        let mut mender = Mender::default();
        for block in [first, second] {
            let frame = head(block.len(), HEADERS, END_HEADERS, 1);
            let out = mender.frame(&frame, &block).expect("mended");
            let fields = decoded(&out);
            assert_eq!(fields[3], (":authority".into(), "localhost".into()));
            assert_eq!(fields[4].1, "application/grpc");
            assert_eq!(
                fields[2],
                (
                    ":path".into(),
                    "/pluginregistration.Registration/GetInfo".into()
                )
            );
            // Literals only: a fresh decoder (as the server's) reads each block alone.
            assert_eq!(fields.len(), 5);
        }
    }

    #[test]
    fn a_valid_authority_and_other_fields_pass_unchanged() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = encoder.encode([
            (&b":authority"[..], &b"localhost"[..]),
            (b"x-long", &[b'a'; 300][..]),
        ]);
        let frame = head(block.len(), HEADERS, END_HEADERS | END_STREAM, 3);
        let out = Mender::default().frame(&frame, &block).expect("mended");
        assert_eq!(out[4], END_HEADERS | END_STREAM);
        assert_eq!(&out[5..9], &3u32.to_be_bytes());
        let fields = decoded(&out);
        assert_eq!(fields[0].1, "localhost");
        assert_eq!(fields[1].1, "a".repeat(300));
    }

    #[test]
    fn padding_priority_and_continuation_are_honoured() {
        let (block, _) = client_blocks();
        let (a, b) = block.split_at(block.len() / 2);
        let mut payload = vec![3u8];
        payload.extend_from_slice(&[0x80, 0, 0, 1, 15]);
        payload.extend_from_slice(a);
        payload.extend_from_slice(&[0, 0, 0]);
        let mut mender = Mender::default();
        let frame = head(payload.len(), HEADERS, PADDED | PRIORITY | END_STREAM, 5);
        assert!(
            mender
                .frame(&frame, &payload)
                .expect("first part")
                .is_empty()
        );
        assert!(mender.in_block());
        let out = mender
            .frame(&head(b.len(), CONTINUATION, END_HEADERS, 5), b)
            .expect("mended");
        assert_eq!(out[4], PRIORITY | END_STREAM | END_HEADERS);
        assert_eq!(&out[9..14], &[0x80, 0, 0, 1, 15]);
        let fields = Decoder::new().decode(&out[14..]).expect("decodes");
        assert_eq!(fields[3].1, b"localhost");
    }

    #[test]
    fn a_block_larger_than_a_frame_goes_out_with_continuations() {
        let value = vec![b'v'; 40_000];
        let block = encode_block(&[(b"x-big".to_vec(), value.clone())]);
        let frames = header_frames(7, 0, None, &block);
        let mut rebuilt = Vec::new();
        let mut at = 0;
        let mut kinds = Vec::new();
        while at < frames.len() {
            let frame: [u8; 9] = frames[at..at + 9].try_into().expect("head");
            let length = payload_length(&frame);
            assert!(length <= MAX_FRAME);
            kinds.push((frame[3], frame[4]));
            rebuilt.extend_from_slice(&frames[at + 9..at + 9 + length]);
            at += 9 + length;
        }
        assert_eq!(
            kinds,
            [(HEADERS, 0), (CONTINUATION, 0), (CONTINUATION, END_HEADERS)]
        );
        assert_eq!(
            Decoder::new().decode(&rebuilt).expect("decodes"),
            [(b"x-big".to_vec(), value)]
        );
    }

    #[test]
    fn hostile_frames_end_the_connection_without_a_panic() {
        let mut mender = Mender::default();
        assert!(matches!(
            mender.frame(&head(1, HEADERS, PADDED | END_HEADERS, 1), &[9]),
            Err(MendError::Protocol(_))
        ));
        assert!(matches!(
            mender.frame(&head(2, HEADERS, PRIORITY | END_HEADERS, 1), &[0, 0]),
            Err(MendError::Protocol(_))
        ));
        assert!(matches!(
            mender.frame(&head(0, CONTINUATION, END_HEADERS, 1), &[]),
            Err(MendError::Protocol(_))
        ));
        // An index past both tables.
        assert!(matches!(
            mender.frame(&head(1, HEADERS, END_HEADERS, 1), &[0xff]),
            Err(MendError::Hpack(_))
        ));
        let mut mender = Mender::default();
        mender
            .frame(&head(0, HEADERS, 0, 1), &[])
            .expect("a block begins");
        assert!(matches!(
            mender.frame(&head(0, CONTINUATION, END_HEADERS, 3), &[]),
            Err(MendError::Protocol(_))
        ));
    }
}
