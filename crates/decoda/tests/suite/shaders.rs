//! Every WGSL shader parses, validates, and translates with naga to SPIR-V (Vulkan), MSL
//! (Metal) and HLSL (DX12), and each translation is produced for every entry point. Runs
//! without a GPU, so a shader that would not compile on one of the three fails here.

/// The variants of the sampler's module (workgroup-memory and subgroup reductions, 64-bit
/// Philox products), the sharded sampling's summaries, the model's ops, and the matrix products and the MoE dispatch (a module each
/// per weight format).
fn shaders() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = [
        ("model", decoda::wgpu::model_shader_source()),
        (
            "sample (workgroup reductions)",
            decoda::wgpu::shader_source(false),
        ),
        (
            "sample (subgroup reductions)",
            decoda::wgpu::shader_source(true),
        ),
        (
            "sample (subgroups, 64-bit Philox products)",
            decoda::wgpu::shader_source_with(true, true),
        ),
        ("shard summaries", decoda::wgpu::shard_shader_source(false)),
        (
            "shard summaries (64-bit Philox products)",
            decoda::wgpu::shard_shader_source(true),
        ),
    ]
    .into_iter()
    .map(|(name, src)| (name.to_string(), src))
    .collect();
    for (name, dtype, bits, group) in decoda::wgpu::WEIGHT_FORMATS {
        v.push((
            format!("mv {name}"),
            decoda::wgpu::mv_shader_source(dtype, bits, group),
        ));
        v.push((
            format!("mv {name} (subgroups)"),
            decoda::wgpu::mv_shader_source_with(dtype, bits, group, true, true),
        ));
        v.push((
            format!("mv {name} (scalar inputs)"),
            decoda::wgpu::mv_shader_source_with(dtype, bits, group, false, false),
        ));
        v.push((
            format!("moe {name}"),
            decoda::wgpu::moe_shader_source_for(dtype, bits, group),
        ));
        v.push((
            format!("moe {name} (subgroups)"),
            decoda::wgpu::moe_shader_source_with(dtype, bits, group, true, true),
        ));
        v.push((
            format!("moe {name} (scalar inputs)"),
            decoda::wgpu::moe_shader_source_with(dtype, bits, group, false, false),
        ));
    }
    v
}

fn parse(name: &str, src: &str) -> (naga::Module, naga::valid::ModuleInfo) {
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{name}: WGSL parse error:\n{}", e.emit_to_string(src)));
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), {
        let mut c = naga::valid::Capabilities::empty();
        if src.contains("subgroupMax") || src.contains("subgroupShuffleXor") {
            c |= naga::valid::Capabilities::SUBGROUP;
        }
        if src.contains("u64(") {
            c |= naga::valid::Capabilities::SHADER_INT64;
        }
        c
    })
    .validate(&module)
    .unwrap_or_else(|e| panic!("{name}: validation error:\n{}", e.emit_to_string(src)));
    (module, info)
}

#[test]
fn shaders_validate() {
    for (name, src) in shaders() {
        let (module, _) = parse(&name, &src);
        assert!(!module.entry_points.is_empty(), "{name}: no entry point");
    }
}

#[test]
fn shaders_translate_to_spirv() {
    for (name, src) in shaders() {
        let (module, info) = parse(&name, &src);
        let words =
            naga::back::spv::write_vec(&module, &info, &naga::back::spv::Options::default(), None)
                .unwrap_or_else(|e| panic!("{name}: SPIR-V: {e}"));
        assert_eq!(words[0], 0x0723_0203, "{name}: SPIR-V magic number");
    }
}

#[test]
fn shaders_translate_to_msl() {
    for (name, src) in shaders() {
        let (module, info) = parse(&name, &src);
        let options = naga::back::msl::Options {
            lang_version: (2, 1),
            ..Default::default()
        };
        for ep in &module.entry_points {
            let pipeline = naga::back::msl::PipelineOptions {
                entry_point: Some((ep.stage, ep.name.clone())),
                ..Default::default()
            };
            let (text, _) = naga::back::msl::write_string(&module, &info, &options, &pipeline)
                .unwrap_or_else(|e| panic!("{name}: MSL for {}: {e}", ep.name));
            assert!(
                text.contains("kernel"),
                "{name}: MSL for {} has no kernel",
                ep.name
            );
        }
    }
}

#[test]
fn shaders_translate_to_hlsl() {
    for (name, src) in shaders() {
        let (module, info) = parse(&name, &src);
        let options = naga::back::hlsl::Options {
            // wave operations need shader model 6.0 (what wgpu's DX12 backend targets)
            shader_model: naga::back::hlsl::ShaderModel::V6_0,
            ..Default::default()
        };
        for ep in &module.entry_points {
            let pipeline = naga::back::hlsl::PipelineOptions {
                entry_point: Some((ep.stage, ep.name.clone())),
            };
            let mut text = String::new();
            naga::back::hlsl::Writer::new(&mut text, &options, &pipeline)
                .write(&module, &info, None)
                .unwrap_or_else(|e| panic!("{name}: HLSL for {}: {e}", ep.name));
            assert!(
                text.contains("[numthreads("),
                "{name}: HLSL for {}",
                ep.name
            );
        }
    }
}

/// Whether a value of type `ty` holds an array (itself, or a struct member's).
fn holds_array(m: &naga::Module, ty: naga::Handle<naga::Type>) -> bool {
    match &m.types[ty].inner {
        naga::TypeInner::Array { .. } => true,
        naga::TypeInner::Struct { members, .. } => members.iter().any(|s| holds_array(m, s.ty)),
        _ => false,
    }
}

/// The model's kernels, its matrix products and the MoE layer's keep no array in a
/// function's memory (a local variable, an argument or a result): a GPU compiler keeps
/// one indexed in a loop in local memory unless it unrolls the loop, and its loads then
/// run one after another. The H200 lease of dc65b97 measured such kernels (a chunk's
/// inputs, the call rows' and lanes' sums, a tile's weight rows in arrays) at up to
/// 1,000x their bytes' time; named vectors and struct fields hold them now.
#[test]
fn products_hold_no_function_arrays() {
    let mut checked = 0;
    for (name, src) in shaders() {
        if !(name == "model" || name.starts_with("mv ") || name.starts_with("moe ")) {
            continue;
        }
        let (m, _) = parse(&name, &src);
        let funcs = m
            .functions
            .iter()
            .map(|(_, f)| f)
            .chain(m.entry_points.iter().map(|e| &e.function));
        for f in funcs {
            let fname = f.name.clone().unwrap_or_default();
            for (_, v) in f.local_variables.iter() {
                assert!(
                    !holds_array(&m, v.ty),
                    "{name}: `{fname}` holds an array in local `{}`",
                    v.name.clone().unwrap_or_default()
                );
            }
            for a in &f.arguments {
                assert!(
                    !holds_array(&m, a.ty),
                    "{name}: `{fname}` takes an array (`{}`)",
                    a.name.clone().unwrap_or_default()
                );
            }
            if let Some(r) = &f.result {
                assert!(!holds_array(&m, r.ty), "{name}: `{fname}` returns an array");
            }
            checked += 1;
        }
    }
    assert!(checked > 100, "{checked} functions");
}
