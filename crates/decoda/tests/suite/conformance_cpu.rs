//! The backend-generic suite against the fast CPU sampler and the reference.

mod fast {
    decoda::conformance_suite!(Some(decoda::CpuSampler::new()));
}

mod fast_one_thread {
    decoda::conformance_suite!(Some(decoda::CpuSampler::with_threads(1).unwrap()));
}

mod reference {
    decoda::conformance_suite!(Some(decoda::ReferenceSampler));
}
