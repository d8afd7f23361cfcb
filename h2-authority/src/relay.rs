//! The client's side of one connection as a pure, synchronous state machine: bytes in as
//! they arrive (the preface, then frames), the bytes to send the server out, or the error
//! that ends the connection. The async pump ([`crate::mend`]) and the fuzzer drive this
//! same code.
//!
//! A stream that does not open with HTTP/2's preface passes unchanged. After it, a frame
//! that carries a header block (or comes while one is open) is read whole (at most
//! [`MAX_BLOCK`]) and mended; any other frame passes unchanged as its bytes come, never
//! buffered. Cost: a copy of every byte, and the 9-byte head of each frame kept.

use crate::mender::{MAX_BLOCK, MendError, Mender, carries_headers, payload_length};

/// The client's connection preface (RFC 9113, 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Where in the client's stream the relay is.
enum At {
    /// The first bytes, until the preface is whole.
    Preface(Vec<u8>),
    /// No HTTP/2 preface: everything passes unchanged.
    Opaque,
    /// A frame's head, so many bytes of it.
    Head([u8; 9], usize),
    /// A header frame's payload, read whole before it is mended.
    HeaderPayload([u8; 9], Vec<u8>),
    /// So many bytes more of a frame that passes unchanged.
    Passing(usize),
    /// An error ended the connection: nothing more passes.
    Ended,
}

/// One connection's relay of the client's bytes (see the module).
pub struct Relay {
    at: At,
    mender: Mender,
}

impl Default for Relay {
    fn default() -> Relay {
        Relay {
            at: At::Preface(Vec::with_capacity(PREFACE.len())),
            mender: Mender::default(),
        }
    }
}

impl Relay {
    /// Takes the next bytes the client sent and appends what the server is to get to
    /// `out`. An error ends the connection: `out` keeps what was relayed before it, and
    /// every later call fails.
    pub fn push(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), MendError> {
        while !input.is_empty() {
            match &mut self.at {
                At::Ended => return Err(MendError::Protocol("the connection has ended")),
                At::Opaque => {
                    out.extend_from_slice(input);
                    input = &[];
                }
                At::Preface(seen) => {
                    let take = input.len().min(PREFACE.len() - seen.len());
                    seen.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if seen.len() == PREFACE.len() {
                        out.extend_from_slice(seen);
                        self.at = if seen[..] == PREFACE[..] {
                            At::Head([0; 9], 0)
                        } else {
                            // Not HTTP/2 with prior knowledge: the server answers it as it is.
                            At::Opaque
                        };
                    }
                }
                At::Head(head, filled) => {
                    let take = input.len().min(head.len() - *filled);
                    head[*filled..*filled + take].copy_from_slice(&input[..take]);
                    *filled += take;
                    input = &input[take..];
                    if *filled == head.len() {
                        let (head, length) = (*head, payload_length(head));
                        self.at = if carries_headers(&head) || self.mender.in_block() {
                            if length > MAX_BLOCK {
                                self.at = At::Ended;
                                return Err(MendError::Protocol("frame over 1 MiB"));
                            }
                            At::HeaderPayload(head, Vec::with_capacity(length))
                        } else {
                            out.extend_from_slice(&head);
                            At::Passing(length)
                        };
                    }
                }
                At::HeaderPayload(head, payload) => {
                    let length = payload_length(head);
                    let take = input.len().min(length - payload.len());
                    payload.extend_from_slice(&input[..take]);
                    input = &input[take..];
                }
                At::Passing(left) => {
                    let take = input.len().min(*left);
                    out.extend_from_slice(&input[..take]);
                    *left -= take;
                    input = &input[take..];
                }
            }
            self.settle(out)?;
        }
        self.settle(out)
    }

    /// Completes a frame whose bytes are all in: a header frame is mended, a passing
    /// frame's end starts the next head.
    fn settle(&mut self, out: &mut Vec<u8>) -> Result<(), MendError> {
        match &self.at {
            At::HeaderPayload(head, payload) if payload.len() == payload_length(head) => {
                match self.mender.frame(head, payload) {
                    Ok(frames) => {
                        out.extend_from_slice(&frames);
                        self.at = At::Head([0; 9], 0);
                    }
                    Err(err) => {
                        self.at = At::Ended;
                        return Err(err);
                    }
                }
            }
            At::Passing(0) => self.at = At::Head([0; 9], 0),
            _ => {}
        }
        Ok(())
    }

    /// The client's stream ended: appends what is left to send (a short preface or
    /// frame head passes as it came). A header frame cut short is an error.
    pub fn finish(self, out: &mut Vec<u8>) -> Result<(), MendError> {
        match self.at {
            At::Preface(seen) => out.extend_from_slice(&seen),
            At::Head(head, filled) => out.extend_from_slice(&head[..filled]),
            At::HeaderPayload(..) => return Err(MendError::Truncated),
            At::Ended => return Err(MendError::Protocol("the connection has ended")),
            At::Opaque | At::Passing(_) => {}
        }
        Ok(())
    }
}

/// What the relay sends the server for a client's whole stream, and the error that
/// ended the connection, if one did (then the bytes are what went before it).
pub fn relay_all(input: &[u8]) -> (Vec<u8>, Result<(), MendError>) {
    let mut relay = Relay::default();
    let mut out = Vec::new();
    let result = relay
        .push(input, &mut out)
        .and_then(|()| relay.finish(&mut out));
    (out, result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mender::{CONTINUATION, HEADERS, head};

    /// A client's stream: the preface, SETTINGS, a HEADERS frame whose block names a
    /// percent-encoded authority, and a DATA frame.
    fn stream() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let settings = [&head(6, 0x4, 0, 0)[..], &[0, 3, 0, 0, 0, 100]].concat();
        let block = crate::mender::encode_block(&[
            (b":authority".to_vec(), b"%2Frun%2Fx.sock".to_vec()),
            (b":path".to_vec(), b"/a.B/C".to_vec()),
        ]);
        let headers = [&head(block.len(), HEADERS, 0x4, 1)[..], &block].concat();
        let data = [&head(5, 0x0, 0x1, 1)[..], b"hello"].concat();
        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&settings);
        input.extend_from_slice(&headers);
        input.extend_from_slice(&data);
        (input, settings, data)
    }

    #[test]
    fn other_frames_pass_byte_for_byte_and_the_authority_is_mended() {
        let (input, settings, data) = stream();
        let (out, result) = relay_all(&input);
        result.expect("relayed");
        assert_eq!(&out[..24], PREFACE);
        assert_eq!(&out[24..24 + settings.len()], settings);
        assert!(out.ends_with(&data));
        let block = &out[24 + settings.len() + 9..out.len() - data.len()];
        let fields = loona_hpack::Decoder::new().decode(block).expect("decodes");
        assert_eq!(fields[0], (b":authority".to_vec(), b"localhost".to_vec()));
        assert_eq!(fields[1], (b":path".to_vec(), b"/a.B/C".to_vec()));
    }

    #[test]
    fn the_output_does_not_depend_on_how_the_bytes_arrive() {
        let (input, _, _) = stream();
        let (whole, result) = relay_all(&input);
        result.expect("relayed");
        let mut relay = Relay::default();
        let mut out = Vec::new();
        for byte in &input {
            relay
                .push(std::slice::from_ref(byte), &mut out)
                .expect("pushed");
        }
        relay.finish(&mut out).expect("finished");
        assert_eq!(out, whole);
    }

    #[test]
    fn a_stream_without_the_preface_passes_unchanged() {
        let input = b"GET / HTTP/1.1\r\nHost: %2F\r\n\r\n\x00\x00\x05\x01\x04".to_vec();
        assert_eq!(relay_all(&input), (input.clone(), Ok(())));
        assert_eq!(relay_all(&input[..10]), (input[..10].to_vec(), Ok(())));
    }

    #[test]
    fn a_header_frame_cut_short_or_too_large_ends_the_connection() {
        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&head(10, HEADERS, 0x4, 1));
        input.extend_from_slice(&[0x82; 4]);
        assert_eq!(
            relay_all(&input),
            (PREFACE.to_vec(), Err(MendError::Truncated))
        );

        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&head(MAX_BLOCK + 1, CONTINUATION, 0x4, 1));
        let (out, result) = relay_all(&input);
        assert_eq!(out, PREFACE);
        assert_eq!(result, Err(MendError::Protocol("frame over 1 MiB")));
    }

    /// The fuzz target's seeds (a mode byte, then the client's bytes) are what they
    /// claim: kubelet's registration call twice (the second by dynamic-table index), and
    /// a PADDED, PRIORITY block with a CONTINUATION; each relays whole with its
    /// authority as `localhost`.
    #[test]
    fn the_fuzz_seeds_are_kubelets_streams_and_relay_whole() {
        for seed in [
            &include_bytes!("../../fuzz/seeds/h2_authority/registration-twice.h2")[..],
            include_bytes!("../../fuzz/seeds/h2_authority/padded-priority-continuation.h2"),
        ] {
            let (out, result) = relay_all(&seed[1..]);
            result.expect("relayed");
            let shown = String::from_utf8_lossy(&out);
            assert!(seed.windows(3).any(|w| w == b"%2F"));
            assert!(!shown.contains("%2F"), "{shown}");
            assert!(shown.contains("localhost"), "{shown}");
        }
        for seed in [
            &include_bytes!("../../fuzz/seeds/h2_authority/device-manager-allocate.h2")[..],
            include_bytes!("../../fuzz/seeds/h2_authority/table-update-trailers.h2"),
        ] {
            relay_all(&seed[1..]).1.expect("relayed");
        }
    }

    #[test]
    fn nothing_passes_after_an_error() {
        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&head(1, HEADERS, 0x4, 1));
        input.push(0xff); // an index past both tables
        input.extend_from_slice(&head(0, 0x4, 0, 0));
        let mut relay = Relay::default();
        let mut out = Vec::new();
        assert!(matches!(
            relay.push(&input, &mut out),
            Err(MendError::Hpack(_))
        ));
        assert_eq!(out, PREFACE);
        assert!(relay.push(&head(0, 0x4, 0, 0), &mut out).is_err());
        assert_eq!(out, PREFACE);
    }
}
