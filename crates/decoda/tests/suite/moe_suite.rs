//! The MoE suite (`decoda::testing::moe`) against the CPU's layer, and, with the
//! `wgpu` feature, against the device's (`WgpuMoe`), which must also build the CPU's
//! dispatch plan.

use decoda::cpu::CpuMoe;
use decoda::moe::SwitchMlp;
use decoda::testing::moe::{branches_match_reference, routing_matches_cpu, uneven_routings};
use decoda::MoeLayer;

fn cpu(layer: &SwitchMlp) -> Result<Box<dyn MoeLayer>, String> {
    // a second CPU layer with the same weights and cutoff
    SwitchMlp::new(
        layer.gate_up().clone(),
        layer.down().clone(),
        layer.sort_cutoff(),
    )
    .map(|l| Box::new(CpuMoe::new(l)) as Box<dyn MoeLayer>)
    .map_err(|e| e.to_string())
}

#[test]
fn cpu_branches_match_reference() {
    let n = branches_match_reference(&cpu).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("cpu: {n} calls");
}

#[test]
fn cpu_uneven_routings() {
    uneven_routings(&cpu).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn cpu_routing() {
    routing_matches_cpu(&cpu).unwrap_or_else(|e| panic!("{e}"));
}

/// The CPU tests above again, in child processes whose kernels run their AVX2 and
/// baseline variants (`DECODA_ISA`): the affine products have an AVX-512 path and a
/// portable one.
#[test]
fn cpu_on_every_instruction_set() {
    if std::env::var("DECODA_ISA").is_ok() {
        return;
    }
    // the CPU tests by their exact names: a filter of "cpu_" also ran the device test
    // `wgpu_builds_the_cpu_plan`, opening a device in every child
    crate::run_on_lower_isas(
        module_path!(),
        &[
            "cpu_branches_match_reference",
            "cpu_uneven_routings",
            "cpu_routing",
        ],
    );
}

#[cfg(feature = "wgpu")]
mod device {
    use super::*;
    use decoda::moe::{Dispatch, DispatchPlan, MoeShape, WeightDtype};
    use decoda::testing::gpu::PerDevice;
    use decoda::testing::moe::branches_agree_bitwise;
    use decoda::testing::synthetic;
    use decoda::wgpu::{WgpuMoe, WgpuSampler};

    /// A long-lived sampler on the calling thread's shared test device, one per device
    /// (`decoda::testing::gpu`).
    fn sampler() -> Option<&'static WgpuSampler> {
        static S: PerDevice<Option<WgpuSampler>> = PerDevice::new();
        S.get_or_init(decoda::testing::gpu::sampler).as_ref()
    }

    fn gpu(layer: &SwitchMlp) -> Result<Box<dyn MoeLayer>, String> {
        let s = sampler().ok_or("no adapter")?;
        WgpuMoe::new(s, layer)
            .map(|l| Box::new(l) as Box<dyn MoeLayer>)
            .map_err(|e| e.to_string())
    }

    /// The layer's weights in about three parts of whole experts (as a real layer is on
    /// an adapter that binds less than it: Qwen3-30B-A3B's is 377 MB at 4 bits, lavapipe
    /// binds 128 MiB), each part a buffer and a dispatch of its own.
    fn gpu_in_parts(layer: &SwitchMlp) -> Result<Box<dyn MoeLayer>, String> {
        let d = decoda::testing::gpu::device().ok_or("no adapter")?;
        // f32 gate, up and down of one expert, a third of the experts a part (a handle to
        // the shared test device with its own part size)
        let expert = 3 * layer.hidden() * layer.intermediate() * 4 + 64;
        let parts = d.with_weight_part_bytes((expert * layer.experts().div_ceil(3)) as u64);
        WgpuMoe::new(&parts, layer)
            .map(|l| Box::new(l) as Box<dyn MoeLayer>)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn wgpu_in_parts_match_reference() {
        if sampler().is_none() {
            return;
        }
        // the uneven routings (every expert empty or full, a few experts taking every
        // token) and the device's routing; the whole branch sweep in the full tier
        uneven_routings(&gpu_in_parts).unwrap_or_else(|e| panic!("{e}"));
        routing_matches_cpu(&gpu_in_parts).unwrap_or_else(|e| panic!("{e}"));
        if decoda::testing::full_tier() {
            let n = branches_match_reference(&gpu_in_parts).unwrap_or_else(|e| panic!("{e}"));
            eprintln!("wgpu in parts: {n} calls");
        }
    }

    #[test]
    fn wgpu_branches_match_reference() {
        if sampler().is_none() {
            return;
        }
        let n = branches_match_reference(&gpu).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("wgpu: {n} calls");
    }

    #[test]
    fn wgpu_branches_agree_bitwise() {
        if sampler().is_none() {
            return;
        }
        // the quick tier: f32 and an affine format (its sum(x) term); every format in the
        // full tier
        let q4 = WeightDtype::Affine(decoda::moe::Affine { bits: 4, group: 32 });
        let n =
            branches_agree_bitwise(&gpu, &[WeightDtype::F32, q4]).unwrap_or_else(|e| panic!("{e}"));
        let p = branches_agree_bitwise(&gpu_in_parts, &[WeightDtype::F32])
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!("wgpu: {n} calls, in parts {p}");
    }

    #[test]
    fn wgpu_uneven_routings() {
        if sampler().is_none() {
            return;
        }
        uneven_routings(&gpu).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn wgpu_routing() {
        if sampler().is_none() {
            return;
        }
        routing_matches_cpu(&gpu).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The device's plan (order, idx, inv_order, offsets) is the CPU's DispatchPlan.
    #[test]
    fn wgpu_builds_the_cpu_plan() {
        let Some(s) = sampler() else { return };
        let shape = MoeShape {
            experts: 32,
            top_k: 4,
            hidden: 32,
            intermediate: 32,
        };
        let layer = synthetic::layer(shape, WeightDtype::F32, true, 4, 3).unwrap();
        let dev = WgpuMoe::new(s, &layer).unwrap();
        let ns: &[usize] = if decoda::testing::full_tier() {
            &[1, 5, 300, 2000]
        } else {
            &[1, 5, 300]
        };
        for &n in ns {
            let (x, routing) = synthetic::inputs(shape, n, n as u64).unwrap();
            for dispatch in [Dispatch::Sorted, Dispatch::Unsorted] {
                let got = dev.device_plan(&x, &routing, dispatch).unwrap();
                let want = DispatchPlan::new(&routing.indices, 4, 32, dispatch).unwrap();
                assert_eq!(got, want, "N = {n} {dispatch:?}");
            }
        }
    }
}
