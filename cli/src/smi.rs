//! `vgpu smi` (placeholder until written).
#[derive(clap::Args)]
pub struct SmiArgs {}
pub fn run(_args: &SmiArgs) -> anyhow::Result<()> { anyhow::bail!("not yet") }
