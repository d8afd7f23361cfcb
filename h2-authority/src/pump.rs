//! The async side: every connection a served socket accepts goes through a pump that
//! feeds the client's bytes to a [`Relay`] and copies the server's answers back as they
//! are.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::UnixStream;

use crate::relay::Relay;

/// How much of the client's stream one read takes.
const READ_CHUNK: usize = 16 << 10;

/// Copies the client's bytes to the server, header blocks mended. Returns at the
/// client's end of stream.
async fn requests(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
) -> io::Result<()> {
    let mut relay = Relay::default();
    let mut chunk = vec![0u8; READ_CHUNK];
    let mut out = Vec::with_capacity(READ_CHUNK);
    loop {
        let read = from.read(&mut chunk).await?;
        if read == 0 {
            relay.finish(&mut out).map_err(io::Error::other)?;
            to.write_all(&out).await?;
            return to.flush().await;
        }
        let result = relay.push(&chunk[..read], &mut out);
        // What came before an error still goes: the server sees the connection end
        // where the client's stream went wrong.
        to.write_all(&out).await?;
        to.flush().await?;
        out.clear();
        result.map_err(io::Error::other)?;
    }
}

/// The server's end of `client`'s connection, with every request's header block
/// mended on its way (see the crate). The pump runs until either side closes.
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
