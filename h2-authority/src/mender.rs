//! One connection's client header blocks, mended: HEADERS and CONTINUATION frames in,
//! the same block out with a URI-valid `:authority` (see the crate header for why).
//!
//! A block is decoded with the client's HPACK state (its dynamic table kept across
//! blocks), an `:authority` that is no URI authority becomes `localhost`, and the fields
//! go out as literals never indexed, so the server's decoder never depends on what the
//! client indexed. A block is limited twice: 1 MiB as it came ([`MAX_BLOCK`]) and 64 KiB
//! decoded ([`MAX_HEADER_LIST`]), since one byte naming a dynamic-table entry decodes to
//! up to 4 KiB.

use loona_hpack::Decoder;

/// The frame types and flags the mender reads (RFC 9113, 6.2 and 6.10).
pub(crate) const HEADERS: u8 = 0x1;
pub(crate) const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame every HTTP/2 peer takes (SETTINGS_MAX_FRAME_SIZE's floor).
const MAX_FRAME: usize = 16_384;
/// A header block (or one frame of it) larger than this as it came ends the connection.
pub const MAX_BLOCK: usize = 1 << 20;
/// A header block whose decoded fields are larger than this (RFC 7541's size: name, value
/// and 32 per field) ends the connection: four times what a hyper server takes (its
/// SETTINGS_MAX_HEADER_LIST_SIZE is 16 KiB), so nothing the server would take is refused,
/// and the block the mender builds stays small however the client's indexes repeat.
pub const MAX_HEADER_LIST: usize = 64 << 10;
/// The dynamic table size the client may use: h2 servers advertise none, so the
/// protocol's default holds.
pub const TABLE_SIZE: usize = 4096;
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
    /// The client's stream ended inside a header frame.
    #[error("the client's stream ended inside a header frame")]
    Truncated,
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
pub(crate) fn head(length: usize, kind: u8, flags: u8, stream: u32) -> [u8; 9] {
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
        // The decoder cannot be stopped from its callback: past the limit, fields are
        // counted, not kept, and the connection ends once the block is read.
        let mut size = 0usize;
        self.decoder
            .decode_with_cb(&block.fragments, |name, value| {
                size = size.saturating_add(name.len() + value.len() + 32);
                if size <= MAX_HEADER_LIST {
                    fields.push((name.into_owned(), value.into_owned()));
                }
            })
            .map_err(|err| MendError::Hpack(format!("{err:?}")))?;
        if size > MAX_HEADER_LIST {
            return Err(MendError::Protocol("header list over 64 KiB decoded"));
        }
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
pub fn is_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
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
    fn a_block_repeating_one_large_indexed_field_is_refused_not_inflated() {
        // One literal of 4000 bytes added to the dynamic table, then named by a one-byte
        // index 40 times: 45 bytes more as sent, 160 KB decoded.
        let mut block = vec![0x40 | 31]; // content-type, incremental indexing
        loona_hpack::encoder::encode_integer_into(4000, 7, 0, &mut block).expect("vec");
        block.extend_from_slice(&[b'x'; 4000]);
        block.extend_from_slice(&[0x80 | 62; 40]);
        let frame = head(block.len(), HEADERS, END_HEADERS, 1);
        assert_eq!(
            Mender::default().frame(&frame, &block),
            Err(MendError::Protocol("header list over 64 KiB decoded"))
        );
        // Within the limit (and one frame) the same references pass, each as a literal.
        block.truncate(block.len() - 37);
        let frame = head(block.len(), HEADERS, END_HEADERS, 1);
        let out = Mender::default().frame(&frame, &block).expect("mended");
        let fields = Decoder::new().decode(&out[9..]).expect("decodes");
        assert_eq!(fields.len(), 4);
        assert!(fields.iter().all(|(_, value)| value.len() == 4000));
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
