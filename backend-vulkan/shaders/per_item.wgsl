// The entry point of the shaders that run one invocation per item (appended to them by build.rs):
// 256 invocations per workgroup, over a grid the host splits over y when it is large; invocation
// `i` runs the shader's `item(i)` for every `i < items()`.
@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = group_index(wid, nwg) * 256u + lid;
    if (i < items()) {
        item(i);
    }
}
