//! What a test client printed as its result: the convention of `tests/clients` and
//! `tests/gpu` scripts is one line `RESULT <json>`, the last such line being the answer
//! (a client may print progress before it). Parsing the JSON is the caller's (this
//! crate takes no dependencies).

use std::process::Output;

/// The text after `RESULT ` on the last such line of `output`'s stdout. Panics with the
/// status, stdout and stderr when there is none, which is the test's failure message.
pub fn result_line(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout);
    match stdout
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("RESULT "))
    {
        Some(line) => line.to_string(),
        None => panic!(
            "no RESULT line; status {:?}\nstdout:\n{stdout}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    fn output(stdout: &str) -> Output {
        Output {
            status: ExitStatus::from_raw(0),
            stdout: stdout.as_bytes().to_vec(),
            stderr: Vec::new(),
        }
    }

    #[test]
    fn the_last_result_line_is_the_answer() {
        let printed = output("RESULT {\"a\": 1}\nprogress\nRESULT {\"a\": 2}\n");
        assert_eq!(result_line(&printed), "{\"a\": 2}");
    }

    #[test]
    #[should_panic(expected = "no RESULT line")]
    fn no_result_line_fails_the_test_with_what_was_printed() {
        result_line(&output("Traceback ...\n"));
    }
}
