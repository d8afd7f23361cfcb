//! The HTTP/2 relay in front of the plugin's and DRA driver's sockets, as a client (any
//! process that can reach the socket) drives it: any bytes, the preface and frames or
//! not. The relay's output is judged against a model of the stream written here from
//! RFC 9113 and 7541, not from the relay: a stream without the preface passes unchanged;
//! every frame that carries no header block passes byte for byte; each header block
//! comes out as HEADERS (and CONTINUATION) frames of the same stream, flags and
//! priority, whose fields (read by a fresh decoder, as literals never indexed) are the
//! client's, with an `:authority` h2 refuses (a percent-encoded path) as `localhost`;
//! the relay ends the connection exactly where the model finds the stream broken, and
//! passes nothing after. How the bytes arrive does not matter, and the output is at most
//! `AMPLIFICATION` times the input (one byte naming a dynamic-table entry of up to 4 KiB).
//!
//! The first byte picks what the rest is. Even: the client's bytes as they come. Odd:
//! one header block, sent after the preface and SETTINGS as a HEADERS frame (flags from
//! the second byte) of the block's true length, so a mutation inside the block does not
//! first break its frame's length (that is how an HPACK block that decodes past
//! `MAX_HEADER_LIST` is within the fuzzer's reach).

#![no_main]

use libfuzzer_sys::fuzz_target;
use loona_hpack::Decoder;
use vgpu_h2_authority::mender::{MAX_BLOCK, MAX_HEADER_LIST, TABLE_SIZE};
use vgpu_h2_authority::{PREFACE, Relay, is_authority, relay_all};

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The most the relay may send per byte it took: a one-byte index names a dynamic-table
/// entry (at most the table's 4096 bytes less 32), sent on as a literal with its lengths.
const AMPLIFICATION: usize = TABLE_SIZE;

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// What the model expects the server to get, in order.
enum Event<'a> {
    /// Bytes that pass unchanged.
    Pass(&'a [u8]),
    /// A header block: its stream, END_STREAM, priority fields and the fields to send.
    Block(u32, u8, Option<[u8; 5]>, Fields),
}

/// The block open while CONTINUATION frames are awaited.
struct Open {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    fragments: Vec<u8>,
}

/// The model: what passes, and whether the stream ends broken (the relay's error).
fn model(input: &[u8]) -> (Vec<Event<'_>>, bool) {
    if input.len() < PREFACE.len() || input[..PREFACE.len()] != PREFACE[..] {
        return (vec![Event::Pass(input)], false);
    }
    let mut events = vec![Event::Pass(&input[..PREFACE.len()])];
    let mut rest = &input[PREFACE.len()..];
    let mut decoder = Decoder::new();
    decoder.set_max_allowed_table_size(TABLE_SIZE);
    let mut open: Option<Open> = None;
    loop {
        if rest.len() < 9 {
            if !rest.is_empty() {
                events.push(Event::Pass(rest));
            }
            return (events, false);
        }
        let length = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        let (kind, flags) = (rest[3], rest[4]);
        let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]) & 0x7fff_ffff;
        if !matches!(kind, HEADERS | CONTINUATION) && open.is_none() {
            let end = rest.len().min(9 + length);
            events.push(Event::Pass(&rest[..end]));
            rest = &rest[end..];
            continue;
        }
        if length > MAX_BLOCK || rest.len() < 9 + length {
            return (events, true);
        }
        let payload = &rest[9..9 + length];
        rest = &rest[9 + length..];
        match (kind, open.as_mut()) {
            (HEADERS, None) => {
                let mut fragment = payload;
                if flags & PADDED != 0 {
                    let Some((&pad, after)) = fragment.split_first() else {
                        return (events, true);
                    };
                    if usize::from(pad) > after.len() {
                        return (events, true);
                    }
                    fragment = &after[..after.len() - usize::from(pad)];
                }
                let mut priority = None;
                if flags & PRIORITY != 0 {
                    if fragment.len() < 5 {
                        return (events, true);
                    }
                    priority = Some(fragment[..5].try_into().expect("five bytes"));
                    fragment = &fragment[5..];
                }
                open = Some(Open {
                    stream,
                    flags,
                    priority,
                    fragments: fragment.to_vec(),
                });
            }
            (CONTINUATION, Some(block))
                if block.stream == stream && block.fragments.len() + length <= MAX_BLOCK =>
            {
                block.fragments.extend_from_slice(payload);
            }
            _ => return (events, true),
        }
        if flags & END_HEADERS == 0 {
            continue;
        }
        let block = open.take().expect("a block is open");
        let Ok(mut fields) = decoder.decode(&block.fragments) else {
            return (events, true);
        };
        let size: usize = fields.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
        if size > MAX_HEADER_LIST {
            return (events, true);
        }
        for (name, value) in &mut fields {
            if name.as_slice() == b":authority" && value.contains(&b'%') && !value.contains(&b'@') {
                // A percent-encoded path (no userinfo, where `%` may stand) is no authority.
                assert!(!is_authority(value), "h2 would take {value:?}");
            }
            if name.as_slice() == b":authority" && !is_authority(value) {
                *value = b"localhost".to_vec();
            }
        }
        events.push(Event::Block(
            block.stream,
            block.flags & END_STREAM,
            block.priority,
            fields,
        ));
    }
}

/// Reads one header block the relay sent from `out` at `at`: its stream, flags,
/// priority and fields (decoded alone, as literals need no table); moves `at` past it.
fn sent_block(out: &[u8], at: &mut usize) -> (u32, u8, Option<[u8; 5]>, Fields) {
    let mut fragments = Vec::new();
    let mut first: Option<(u32, u8, Option<[u8; 5]>)> = None;
    loop {
        let head: [u8; 9] = out[*at..*at + 9].try_into().expect("a frame head");
        let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        assert!(length <= 16_384, "a frame larger than every peer takes");
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
        let mut payload = &out[*at + 9..*at + 9 + length];
        *at += 9 + length;
        match first {
            None => {
                assert_eq!(head[3], HEADERS, "a block opens with HEADERS");
                assert_eq!(head[4] & !(END_STREAM | END_HEADERS | PRIORITY), 0);
                let priority = (head[4] & PRIORITY != 0).then(|| {
                    let fields: [u8; 5] = payload[..5].try_into().expect("priority");
                    payload = &payload[5..];
                    fields
                });
                first = Some((stream, head[4] & END_STREAM, priority));
            }
            Some((opened, ..)) => {
                assert_eq!(head[3], CONTINUATION, "a block goes on with CONTINUATION");
                assert_eq!(stream, opened, "a block stays on its stream");
                assert_eq!(head[4] & !END_HEADERS, 0);
            }
        }
        fragments.extend_from_slice(payload);
        if head[4] & END_HEADERS != 0 {
            break;
        }
    }
    assert!(
        fragments.len() <= MAX_HEADER_LIST,
        "a block grew past the limit"
    );
    let fields = Decoder::new()
        .decode(&fragments)
        .expect("the relay's block decodes alone");
    let (stream, end_stream, priority) = first.expect("a HEADERS frame");
    (stream, end_stream, priority, fields)
}

/// The client's bytes the input stands for (see the module).
fn client_bytes(input: &[u8]) -> Vec<u8> {
    match input {
        [mode, rest @ ..] if mode & 1 == 0 => rest.to_vec(),
        [_, flags, block @ ..] => {
            let mut bytes = PREFACE.to_vec();
            bytes.extend_from_slice(&[0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100]);
            let length = (block.len() as u32).to_be_bytes();
            bytes.extend_from_slice(&length[1..]);
            bytes.extend_from_slice(&[HEADERS, *flags, 0, 0, 0, 1]);
            bytes.extend_from_slice(block);
            bytes
        }
        _ => Vec::new(),
    }
}

fuzz_target!(|input: &[u8]| {
    let data = &client_bytes(input)[..];
    let (out, result) = relay_all(data);

    // How the bytes arrive does not matter.
    let mut relay = Relay::default();
    let mut chunked = Vec::new();
    let mut rest = data;
    let mut step = 1;
    let mut chunked_result = Ok(());
    while !rest.is_empty() && chunked_result.is_ok() {
        let (chunk, after) = rest.split_at(rest.len().min(step));
        chunked_result = relay.push(chunk, &mut chunked);
        rest = after;
        step = step % 13 + 1;
    }
    if chunked_result.is_ok() {
        chunked_result = relay.finish(&mut chunked);
    }
    assert_eq!(chunked, out, "the output depends on how the bytes arrive");
    assert_eq!(chunked_result, result);

    assert!(out.len() <= AMPLIFICATION * data.len(), "amplified");

    let (events, broken) = model(data);
    let mut at = 0;
    for event in events {
        match event {
            Event::Pass(bytes) => {
                assert_eq!(&out[at..at + bytes.len()], bytes, "changed in passing");
                at += bytes.len();
            }
            Event::Block(stream, end_stream, priority, fields) => {
                let sent = sent_block(&out, &mut at);
                assert_eq!(sent, (stream, end_stream, priority, fields.clone()));
                for (name, value) in &fields {
                    if name.as_slice() == b":authority" {
                        assert!(is_authority(value), "an authority h2 refuses went on");
                    }
                }
            }
        }
    }
    assert_eq!(at, out.len(), "sent more than the model");
    assert_eq!(result.is_err(), broken, "{result:?}");
});
