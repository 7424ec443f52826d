//! The end-to-end tests, one module per subject, linked into one test binary:
//! each binary links the whole daemon (the AWS SDK with it), and twenty-six of
//! them took 3.9 GB of disk and a link each (CI's linker once died of a full
//! disk). Run one subject with `cargo test --release --test e2e <module>::`.
//! Tests that keep both cores busy on their own take turns
//! (`skippr_tests::both_cores`).

mod bench;
mod chaos_disk;
mod chaos_s3;
mod cluster_cli;
mod cluster_run;
mod crash_states;
mod dead_letters;
mod file_rotation;
mod forgetfs;
mod fuzz_input;
mod hostile_input;
mod lost_segment;
mod operator_messages;
mod planted_bugs;
mod plugins;
mod postgres_sink;
mod power_cut;
mod power_cut_cluster;
mod readme;
mod run_disk;
mod s3;
mod s3_sink;
mod seed_sweep;
mod sim_cli;
mod singer;
mod sink_contract;
mod upgrade;
