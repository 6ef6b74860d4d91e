//! The rendezvous on threads and sockets: collectives, the secret, failures and their texts.

use super::handshake::{is_secret_refusal, HELLO_BYTES};
use super::*;
use crate::rank_env::Launcher;
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT_JOB: AtomicUsize = AtomicUsize::new(0);
const CONNECT: Duration = Duration::from_secs(10);

/// A job id no other test (or test process) uses.
fn unique_job(name: &str) -> String {
    format!(
        "unit-{}-{}-{name}",
        std::process::id(),
        NEXT_JOB.fetch_add(1, Ordering::SeqCst)
    )
}

fn rank_env(rank: usize, world: usize, job: &str, master: Option<(String, u16)>) -> RankEnv {
    RankEnv {
        rank,
        world,
        local_rank: rank,
        local_world: world,
        launcher: Launcher::Weft,
        job_id: Some(job.to_string()),
        master,
        secret: None,
        insecure_tcp: false,
    }
}

/// `envs` with `secret` on every rank.
fn with_secret(mut envs: Vec<RankEnv>, secret: &JobSecret) -> Vec<RankEnv> {
    for e in &mut envs {
        e.secret = Some(secret.clone());
    }
    envs
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One env per entry of `ranks`, all of one job of size `world`.
fn envs(name: &str, ranks: &[usize], world: usize, master: Option<(String, u16)>) -> Vec<RankEnv> {
    let job = unique_job(name);
    ranks
        .iter()
        .map(|&r| rank_env(r, world, &job, master.clone()))
        .collect()
}

/// Runs `body` for each env on its own thread; results in the order of `envs`.
fn on_threads<T: Send>(envs: Vec<RankEnv>, body: impl Fn(RankEnv) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = envs.into_iter().map(|env| s.spawn(|| body(env))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// Every rank's error text (panics if a rank succeeded).
fn errors<E: std::fmt::Display>(results: Vec<Result<(), E>>) -> Vec<String> {
    results
        .into_iter()
        .map(|r| match r {
            Ok(()) => panic!("expected this rank to fail"),
            Err(e) => format!("{e:#}"),
        })
        .collect()
}

/// The kind of a rendezvous error (panics on any other error).
fn why(e: &PglError) -> Why {
    match e {
        PglError::Rendezvous { failure, .. } => failure.clone(),
        other => panic!("not a rendezvous error: {other:?}"),
    }
}

/// Every rank's kind of failure (panics if a rank succeeded or failed otherwise).
fn whys(results: &[Result<(), PglError>]) -> Vec<Why> {
    results
        .iter()
        .map(|r| why(r.as_ref().expect_err("expected this rank to fail")))
        .collect()
}

/// Rank- and round-dependent bytes of varying length, empty for some (rank 0, round 0 included).
fn payload(rank: usize, round: usize) -> Vec<u8> {
    let len = (rank * 31 + round * 7) % 50;
    (0..len).map(|i| (rank * 13 + round + i) as u8).collect()
}

fn exercise(env: RankEnv, rounds: usize) -> Result<()> {
    let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
    assert_eq!((rdzv.rank(), rdzv.world()), (env.rank, env.world));
    for round in 0..rounds {
        let all = rdzv.all_gather(&payload(env.rank, round))?;
        let expected: Vec<Vec<u8>> = (0..env.world).map(|r| payload(r, round)).collect();
        assert_eq!(
            all, expected,
            "all_gather round {round} on rank {}",
            env.rank
        );
        if round % 3 == 0 {
            let root = round % env.world;
            let got = rdzv.broadcast(root, &payload(env.rank, round + 1000))?;
            assert_eq!(
                got,
                payload(root, round + 1000),
                "broadcast round {round} on rank {}",
                env.rank
            );
        }
        if round % 5 == 0 {
            rdzv.barrier()?;
        }
    }
    Ok(())
}

#[test]
fn world_of_one_needs_no_socket() {
    let mut rdzv = Rendezvous::connect(&RankEnv::standalone(), CONNECT).unwrap();
    assert_eq!(rdzv.all_gather(b"abc").unwrap(), vec![b"abc".to_vec()]);
    assert_eq!(rdzv.broadcast(0, b"xyz").unwrap(), b"xyz");
    rdzv.barrier().unwrap();
    let e = rdzv.broadcast(1, b"").unwrap_err().to_string();
    assert!(e.contains("root 1, which is not below world size 1"), "{e}");
}

#[test]
fn collectives_are_correct_for_several_world_sizes() {
    for world in [2, 3, 5] {
        let ranks: Vec<usize> = (0..world).collect();
        for result in on_threads(envs("sizes", &ranks, world, None), |env| exercise(env, 30)) {
            result.unwrap();
        }
    }
}

#[test]
fn a_thousand_rounds() {
    for result in on_threads(envs("many", &[0, 1, 2], 3, None), |env| exercise(env, 1000)) {
        result.unwrap();
    }
}

#[test]
fn tcp_transport() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let master = Some(("127.0.0.1".to_string(), port));
    let secret = JobSecret::generate().unwrap();
    let tcp = with_secret(envs("tcp", &[0, 1, 2, 3], 4, master), &secret);
    let results = on_threads(tcp, |env| {
        let rdzv = Rendezvous::connect(&env, CONNECT)?;
        assert_eq!(rdzv.address(), format!("127.0.0.1:{port}"));
        drop(rdzv);
        Ok(())
    });
    results.into_iter().collect::<Result<()>>().unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let master = Some(("127.0.0.1".to_string(), port));
    let tcp = with_secret(envs("tcp", &[0, 1, 2], 3, master), &secret);
    for result in on_threads(tcp, |env| exercise(env, 100)) {
        result.unwrap();
    }
}

#[test]
fn tcp_without_a_secret_is_refused_unless_waived() {
    let master = Some(("127.0.0.1".to_string(), free_port()));
    let results = on_threads(envs("nosecret", &[0, 1], 2, master.clone()), |env| {
        Rendezvous::connect(&env, CONNECT).map(drop)
    });
    assert_eq!(whys(&results), vec![Why::Refused, Why::Refused]);
    for e in errors(results) {
        assert!(
            e.contains("over TCP") && e.contains("WEFT_JOB_SECRET"),
            "{e}"
        );
    }
    let mut waived = envs("waived", &[0, 1], 2, master);
    for e in &mut waived {
        e.insecure_tcp = true;
    }
    for r in on_threads(waived, |env| exercise(env, 3)) {
        r.unwrap();
    }
}

#[test]
fn a_shared_secret_joins_over_the_unix_socket() {
    let secret = JobSecret::generate().unwrap();
    for r in on_threads(
        with_secret(envs("secret", &[0, 1, 2], 3, None), &secret),
        |env| exercise(env, 20),
    ) {
        r.unwrap();
    }
}

/// A process at `env`'s rendezvous address that says Hello as `rank` of `world` with a secret,
/// answers rank 0's challenge with a forged proof, and returns rank 0's answer (kind, text).
fn stranger_with_a_forged_proof(env: &RankEnv, rank: u64, world: u64) -> (Kind, String) {
    let endpoint = Endpoint::for_env(env).unwrap();
    let mut stream = loop {
        match endpoint.connect(Duration::from_secs(1)) {
            Ok(st) => break st,
            Err(_) => std::thread::sleep(RETRY_INTERVAL),
        }
    };
    let mut hello = [0u8; HELLO_BYTES];
    hello[..8].copy_from_slice(&rank.to_le_bytes());
    hello[8..16].copy_from_slice(&world.to_le_bytes());
    hello[16] = 1;
    let soon = || Instant::now() + Duration::from_secs(5);
    send_frame(&mut stream, Kind::Hello, 0, &[&hello], soon()).unwrap();
    let challenge = recv_frame(&mut stream, 1 << 10, soon()).unwrap();
    assert_eq!(challenge.kind, Kind::Challenge);
    send_frame(&mut stream, Kind::Proof, 0, &[&[7u8; PROOF_BYTES]], soon()).unwrap();
    let answer = recv_frame(&mut stream, 1 << 10, soon()).unwrap();
    (
        answer.kind,
        String::from_utf8_lossy(&answer.payload).into_owned(),
    )
}

/// A process that knows the job's address but not its secret says Hello as rank 1, answers
/// rank 0's challenge with a forged proof and is refused; then the real rank 1 joins and the
/// job carries on. (Fails if rank 0 seats a member without checking its proof: the stranger
/// would get the Welcome.)
#[test]
fn a_stranger_without_the_secret_is_refused_and_the_job_carries_on() {
    let secret = JobSecret::generate().unwrap();
    let master = Some(("127.0.0.1".to_string(), free_port()));
    let job = with_secret(envs("stranger", &[0, 1], 2, master), &secret);
    let (root_env, member_env) = (job[0].clone(), job[1].clone());
    std::thread::scope(|s| {
        let root = s.spawn(|| exercise(root_env, 5));
        let (kind, text) = stranger_with_a_forged_proof(&member_env, 1, 2);
        assert_eq!(kind, Kind::Abort, "the stranger got {kind:?}");
        assert!(text.contains("did not match"), "{text}");
        let member = s.spawn(|| exercise(member_env, 5));
        root.join().unwrap().unwrap();
        member.join().unwrap().unwrap();
    });
}

/// World 3: rank 1 joins with the secret, a stranger claiming rank 2 is refused, the real rank 2
/// never comes. Rank 0 times out naming rank 2 (and the refused stranger); rank 1, told so by
/// rank 0's Abort, fails as `Aborted`, not `Unauthenticated`, though the text quotes the
/// stranger's refusal. (Fails if a member classifies any Abort that mentions the secret.)
#[test]
fn an_abort_quoting_a_strangers_refusal_is_not_this_ranks() {
    let secret = JobSecret::generate().unwrap();
    let master = Some(("127.0.0.1".to_string(), free_port()));
    let job = with_secret(envs("quoted", &[0, 1], 3, master.clone()), &secret);
    let stranger_env = with_secret(envs("quoted-s", &[2], 3, master), &secret).remove(0);
    let wait = Duration::from_secs(3);
    let results = std::thread::scope(|s| {
        let ranks: Vec<_> = job
            .into_iter()
            .map(|env| s.spawn(move || Rendezvous::connect(&env, wait).map(drop)))
            .collect();
        let (kind, text) = stranger_with_a_forged_proof(&stranger_env, 2, 3);
        assert_eq!(kind, Kind::Abort);
        assert!(is_secret_refusal(&text), "{text}");
        ranks
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert_eq!(
        whys(&results),
        vec![Why::Timeout { ranks: vec![2] }, Why::Aborted]
    );
    let e = errors(results);
    assert!(e[1].contains("the last connection refused"), "{}", e[1]);
}

#[test]
fn a_member_refuses_a_rank_0_without_its_secret() {
    let master = Some(("127.0.0.1".to_string(), free_port()));
    let mut job = envs("impostor", &[0, 1], 2, master);
    job[0].secret = Some(JobSecret::generate().unwrap());
    job[1].secret = Some(JobSecret::generate().unwrap());
    let results = on_threads(job, |env| {
        Rendezvous::connect(&env, Duration::from_secs(2)).map(drop)
    });
    assert_eq!(
        whys(&results),
        vec![Why::Timeout { ranks: vec![1] }, Why::Unauthenticated]
    );
    let e = errors(results);
    assert!(e[1].contains("did not prove the job secret"), "{}", e[1]);
    assert!(e[0].contains("rank(s) 1 did not arrive"), "{}", e[0]);
    assert!(
        e[0].contains("the last connection refused: one claiming rank 1"),
        "{}",
        e[0]
    );
}

/// A process listening at the job's address that answers Hello with Welcome (never proving
/// the secret) is refused by a member that has one. (Fails if the member takes any Welcome.)
#[test]
fn a_member_refuses_a_welcome_without_a_challenge() {
    let port = free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let mut job = envs("welcome", &[1], 2, Some(("127.0.0.1".to_string(), port)));
    job[0].secret = Some(JobSecret::generate().unwrap());
    let env = job.remove(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let (tcp, _) = listener.accept().unwrap();
            let mut stream = Stream::Tcp(tcp);
            let soon = Instant::now() + Duration::from_secs(5);
            let hello = recv_frame(&mut stream, 1 << 10, soon).unwrap();
            assert_eq!(hello.kind, Kind::Hello);
            send_frame(&mut stream, Kind::Welcome, 0, &[], soon).unwrap();
            // Keep the connection open until the member has decided.
            let _ = recv_frame(&mut stream, 1 << 10, soon);
        });
        let e = Rendezvous::connect(&env, Duration::from_secs(5))
            .map(drop)
            .unwrap_err();
        assert_eq!(why(&e), Why::Unauthenticated);
        let e = e.to_string();
        assert!(
            e.contains("answered with welcome instead of proving"),
            "{e}"
        );
    });
}

#[test]
fn a_member_without_the_secret_is_told_why() {
    let master = Some(("127.0.0.1".to_string(), free_port()));
    let mut job = envs("absent", &[0, 1], 2, master);
    job[0].secret = Some(JobSecret::generate().unwrap());
    job[1].insecure_tcp = true;
    let results = on_threads(job, |env| {
        Rendezvous::connect(&env, Duration::from_secs(2)).map(drop)
    });
    assert_eq!(why(results[1].as_ref().unwrap_err()), Why::Unauthenticated);
    let e = errors(results);
    assert!(e[1].contains("rank 0 requires the job secret"), "{}", e[1]);
}

#[test]
fn missing_rank_is_named() {
    let start = Instant::now();
    let results = on_threads(envs("missing", &[0, 1], 3, None), |env| {
        Rendezvous::connect(&env, Duration::from_secs(1)).map(drop)
    });
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(
        whys(&results),
        vec![Why::Timeout { ranks: vec![2] }, Why::Aborted]
    );
    for e in errors(results) {
        assert!(
            e.contains("rank(s) 2 did not arrive within 1 s (world 3)"),
            "{e}"
        );
    }
}

#[test]
fn member_without_root_gives_up() {
    let start = Instant::now();
    let env = &envs("noroot", &[1], 2, None)[0];
    let e = Rendezvous::connect(env, Duration::from_millis(300))
        .map(drop)
        .unwrap_err();
    assert_eq!(why(&e), Why::Timeout { ranks: vec![0] });
    let e = e.to_string();
    assert!(
        e.contains("rank 1 could not reach rank 0 at unix:") && e.contains("within 300 ms"),
        "{e}"
    );
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[test]
fn different_world_sizes_are_reported_to_both() {
    let mut envs = envs("world", &[0, 1], 2, None);
    envs[1].world = 3;
    envs[1].local_world = 3;
    let results = on_threads(envs, |env| Rendezvous::connect(&env, CONNECT).map(drop));
    assert_eq!(whys(&results), vec![Why::Mismatch, Why::Aborted]);
    for e in errors(results) {
        assert!(
            e.contains("rank 1 was started with world size 3, rank 0 with 2"),
            "{e}"
        );
    }
}

#[test]
fn duplicate_rank_is_reported() {
    let results = on_threads(envs("dup", &[0, 1, 1], 3, None), |env| {
        Rendezvous::connect(&env, Duration::from_secs(3)).map(drop)
    });
    for e in errors(results) {
        assert!(e.contains("rank 1 connected twice"), "{e}");
    }
}

#[test]
fn mismatched_collectives_are_reported() {
    let results = on_threads(envs("kind", &[0, 1], 2, None), |env| {
        let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
        rdzv.barrier()?;
        if env.rank == 0 {
            rdzv.all_gather(b"x").map(drop)
        } else {
            rdzv.barrier()
        }
    });
    for e in errors(results) {
        assert!(
            e.contains("rank 1 called barrier but rank 0 called all_gather in collective #2"),
            "{e}"
        );
    }
    let results = on_threads(envs("root", &[0, 1, 2], 3, None), |env| {
        let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
        rdzv.broadcast(if env.rank == 2 { 2 } else { 1 }, b"x")
            .map(drop)
    });
    for e in errors(results) {
        assert!(
            e.contains(
                "rank 2 called broadcast with root 2 but rank 0 with root 1 in collective #1"
            ),
            "{e}"
        );
    }
}

#[test]
fn abort_reaches_every_rank_and_poisons_later_calls() {
    let results = on_threads(envs("abort", &[0, 1, 2], 3, None), |env| {
        let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
        rdzv.barrier()?;
        if env.rank == 2 {
            rdzv.abort("out of memory on GPU 2");
        }
        let first = rdzv.barrier().unwrap_err();
        let start = Instant::now();
        let again = rdzv.all_gather(b"x").unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(1));
        assert_eq!(why(&again), why(&first), "{again}");
        let again = again.to_string();
        assert!(again.contains("already failed"), "{again}");
        Err(first)
    });
    assert_eq!(whys(&results), vec![Why::Aborted; 3]);
    let errors = errors(results);
    for e in &errors[..2] {
        assert!(e.contains("rank 2 failed: out of memory on GPU 2"), "{e}");
    }
    assert!(
        errors[2].contains("this rank aborted: out of memory on GPU 2"),
        "{}",
        errors[2]
    );
}

#[test]
fn root_abort_reaches_members() {
    let results = on_threads(envs("rootabort", &[0, 1, 2], 3, None), |env| {
        let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
        if env.rank == 0 {
            rdzv.abort("bad input");
            return Err(anyhow!("rank 0 aborted"));
        }
        let r = rdzv.barrier();
        assert_eq!(why(r.as_ref().unwrap_err()), Why::Aborted);
        Ok(r?)
    });
    for e in &errors(results)[1..] {
        assert!(e.contains("rank 0 failed: bad input"), "{e}");
    }
}

#[test]
fn late_rank_is_named_by_everyone() {
    let results = on_threads(envs("late", &[0, 1, 2], 3, None), |env| {
        let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
        rdzv.set_timeout(Duration::from_secs(1));
        if env.rank == 2 {
            std::thread::sleep(Duration::from_secs(3));
        }
        let start = Instant::now();
        let result = rdzv.barrier();
        // Ranks 0 and 1 give up after the timeout, before rank 2 even arrives.
        if env.rank < 2 {
            assert!(
                start.elapsed() < Duration::from_millis(2500),
                "{:?}",
                start.elapsed()
            );
        }
        result
    });
    assert_eq!(
        why(results[0].as_ref().unwrap_err()),
        Why::Timeout { ranks: vec![2] }
    );
    for e in errors(results) {
        assert!(
            e.contains("timed out after 1 s waiting for rank 2 in collective #1"),
            "{e}"
        );
    }
}

#[test]
fn closed_member_is_named() {
    let results = on_threads(envs("closed", &[0, 1, 2], 3, None), |env| {
        let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
        rdzv.barrier()?;
        if env.rank == 2 {
            drop(rdzv);
            return Err(anyhow!("rank 2 left"));
        }
        let r = rdzv.barrier();
        let expected = if env.rank == 0 {
            Why::PeerGone { rank: 2 }
        } else {
            Why::Aborted
        };
        assert_eq!(why(r.as_ref().unwrap_err()), expected);
        Ok(r?)
    });
    for e in &errors(results)[..2] {
        assert!(
            e.contains("rank 2 closed its connection (exited or crashed) during collective #2"),
            "{e}"
        );
    }
}

#[test]
fn closed_root_is_named() {
    let results = on_threads(envs("closedroot", &[0, 1, 2], 3, None), |env| {
        let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
        rdzv.barrier()?;
        if env.rank == 0 {
            drop(rdzv);
            return Err(anyhow!("rank 0 left"));
        }
        // Give rank 0 time to close first.
        std::thread::sleep(Duration::from_millis(100));
        let r = rdzv.barrier();
        assert_eq!(why(r.as_ref().unwrap_err()), Why::PeerGone { rank: 0 });
        Ok(r?)
    });
    for e in &errors(results)[1..] {
        assert!(
            e.contains("rank 0 closed its connection (exited or crashed) during collective #2"),
            "{e}"
        );
    }
}

#[test]
fn payload_limits() {
    let results = on_threads(envs("limit", &[0, 1], 2, None), |env| {
        let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
        rdzv.set_max_payload(100);
        rdzv.all_gather(&vec![0u8; if env.rank == 1 { 101 } else { 100 }])
            .map(drop)
    });
    assert_eq!(whys(&results), vec![Why::Aborted, Why::Refused]);
    for e in errors(results) {
        assert!(
            e.contains("rank 1 passed 101 bytes to all_gather, over the limit of 100 bytes"),
            "{e}"
        );
    }
    let results = on_threads(envs("limit", &[0, 1, 2], 3, None), |env| {
        let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
        rdzv.set_max_payload(100);
        rdzv.all_gather(&[7u8; 60]).map(drop)
    });
    for e in errors(results) {
        assert!(
            e.contains("all_gather result of 180 bytes (world 3) exceeds the limit of 100 bytes"),
            "{e}"
        );
    }
}

#[test]
fn address_errors() {
    let mut multi = rank_env(1, 4, "multi", None);
    multi.local_world = 2;
    let e = Rendezvous::connect(&multi, CONNECT).map(drop).unwrap_err();
    assert!(matches!(e, PglError::Launcher(_)), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("a multi-node job needs MASTER_ADDR and MASTER_PORT (or WEFT_MASTER_ADDR/PORT)"),
        "{e}"
    );
    let mut no_job = rank_env(0, 2, "x", None);
    no_job.job_id = None;
    let e = Rendezvous::connect(&no_job, CONNECT).map(drop).unwrap_err();
    assert!(matches!(e, PglError::Launcher(_)), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("set WEFT_JOB_ID") && e.contains("MASTER_ADDR/MASTER_PORT"),
        "{e}"
    );
}

#[test]
fn stale_socket_is_replaced_and_live_one_refused() {
    let envs1 = envs("stale", &[0, 1], 2, None);
    let path = unix_socket_path(envs1[0].job_id.as_deref().unwrap()).unwrap();
    drop(UnixListener::bind(&path).unwrap()); // leaves a dead socket file behind
    assert!(path.exists());
    for result in on_threads(envs1, |env| exercise(env, 3)) {
        result.unwrap();
    }
    assert!(!path.exists(), "the socket file outlived the handshake");

    let envs2 = envs("live", &[0], 2, None);
    let path = unix_socket_path(envs2[0].job_id.as_deref().unwrap()).unwrap();
    let live = UnixListener::bind(&path).unwrap();
    let e = Rendezvous::connect(&envs2[0], CONNECT)
        .map(drop)
        .unwrap_err()
        .to_string();
    assert!(e.contains("another rendezvous is already listening"), "{e}");
    drop(live);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn socket_names() {
    let p = unix_socket_path("job/with spaces:1").unwrap();
    let name = p.file_name().unwrap().to_str().unwrap();
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    assert_eq!(name, format!("weft-rdzv-{uid}-job_with_spaces_1.sock"));
    let long_a = unix_socket_path(&format!("{}a", "x".repeat(200))).unwrap();
    let long_b = unix_socket_path(&format!("{}b", "x".repeat(200))).unwrap();
    assert_ne!(long_a, long_b);
    assert!(long_a.as_os_str().len() < 108, "{}", long_a.display());
}

#[test]
fn timeout_variable() {
    assert_eq!(op_timeout(None).unwrap(), Duration::from_secs(300));
    assert_eq!(
        op_timeout(Some("2.5".into())).unwrap(),
        Duration::from_millis(2500)
    );
    for bad in ["0", "-1", "abc", "", "inf"] {
        let e = op_timeout(Some(bad.into())).unwrap_err();
        assert!(
            matches!(&e, PglError::Setting { var: TIMEOUT_VAR, value, .. } if value == bad),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.contains("WEFT_RDZV_TIMEOUT") && e.contains("positive number of seconds"),
            "{e}"
        );
    }
}

#[test]
fn part_encoding() {
    let parts = vec![b"a".to_vec(), vec![], b"xyz".to_vec()];
    let mut bytes = Vec::new();
    for p in &parts {
        bytes.extend_from_slice(&(p.len() as u64).to_le_bytes());
        bytes.extend_from_slice(p);
    }
    assert_eq!(decode_parts(&bytes, 3), Some(parts));
    assert_eq!(decode_parts(&bytes, 2), None);
    assert_eq!(decode_parts(&bytes[..bytes.len() - 1], 3), None);
    assert_eq!(fmt_duration(Duration::from_secs(5)), "5 s");
    assert_eq!(fmt_duration(Duration::from_millis(250)), "250 ms");
    assert_eq!(fmt_duration(Duration::from_millis(2500)), "2.5 s");
}

/// Hostile bytes where the rendezvous reads a peer's: the framing of an all-gather's result and a
/// frame on the socket. Nothing panics or reads past what arrived; what is accepted is exactly
/// what the independent encoding below says.
mod hostile {
    use super::*;
    use proptest::prelude::*;

    /// The root's framing of an all-gather result, written out here: a u64 length, the bytes.
    fn encode(parts: &[Vec<u8>]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for p in parts {
            bytes.extend_from_slice(&(p.len() as u64).to_le_bytes());
            bytes.extend_from_slice(p);
        }
        bytes
    }

    /// The kind bytes the wire format defines (wire.rs's table, written out again).
    const KINDS: std::ops::RangeInclusive<u8> = 1..=9;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// Any bytes: parts come back only when encoding them again gives exactly those bytes.
        #[test]
        fn decode_parts_takes_only_exact_framings(
            bytes in prop::collection::vec(any::<u8>(), 0..96), world in 0usize..6
        ) {
            if let Some(parts) = decode_parts(&bytes, world) {
                prop_assert_eq!(parts.len(), world);
                prop_assert_eq!(encode(&parts), bytes);
            }
        }

        /// Framed parts round-trip; cut short or with a byte more, they are refused.
        #[test]
        fn framed_parts_round_trip_and_tampering_is_refused(
            parts in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..12), 0..6),
            cut in 1usize..8, extra in any::<u8>()
        ) {
            let bytes = encode(&parts);
            prop_assert_eq!(decode_parts(&bytes, parts.len()), Some(parts.clone()));
            if bytes.len() >= cut {
                prop_assert_eq!(decode_parts(&bytes[..bytes.len() - cut], parts.len()), None);
            }
            let mut longer = bytes.clone();
            longer.push(extra);
            prop_assert_eq!(decode_parts(&longer, parts.len()), None);
        }

        /// A peer's frame with any magic, kind, length and payload: taken only with the magic, a
        /// defined kind and a length within the limit whose bytes all arrived, and then exactly
        /// those bytes; never a buffer sized by an unchecked length.
        #[test]
        fn recv_frame_takes_only_valid_frames(
            good_magic in any::<bool>(), magic in any::<[u8; 4]>(),
            kind in prop_oneof![3 => 1u8..=9, 1 => any::<u8>()],
            seq in any::<u64>(), len in prop_oneof![0u64..64, any::<u64>()],
            payload in prop::collection::vec(any::<u8>(), 0..80), max_len in 0usize..64
        ) {
            let magic = if good_magic { *b"WFRV" } else { magic };
            let mut bytes = magic.to_vec();
            bytes.push(kind);
            bytes.extend_from_slice(&seq.to_le_bytes());
            bytes.extend_from_slice(&len.to_le_bytes());
            bytes.extend_from_slice(&payload);
            let (mut writer, reader) = UnixStream::pair().unwrap();
            writer.write_all(&bytes).unwrap();
            drop(writer); // the peer is gone after its bytes: a short payload ends in Closed
            let mut stream = Stream::Unix(reader);
            let got = recv_frame(&mut stream, max_len, Instant::now() + Duration::from_secs(5));
            let valid = &magic == b"WFRV"
                && KINDS.contains(&kind)
                && len <= max_len as u64
                && payload.len() as u64 >= len;
            prop_assert_eq!(got.is_ok(), valid);
            if let Ok(f) = got {
                prop_assert_eq!(f.kind as u8, kind);
                prop_assert_eq!(f.seq, seq);
                prop_assert_eq!(&f.payload[..], &payload[..len as usize]);
            }
        }
    }
}
