// RUN: nsa-opt %s --nsa-tile="query-tile=4 kv-tile=32" --one-shot-bufferize="bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map" --nsa-map-to-gpu | FileCheck %s --implicit-check-not=scf.forall --implicit-check-not=linalg. --implicit-check-not=memref.alloc
// RUN: not nsa-opt %s --nsa-tile="query-tile=64 kv-tile=512" --one-shot-bufferize="bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map" --nsa-map-to-gpu 2>&1 | FileCheck %s --check-prefix=TOOBIG
// RUN: nsa-opt %s --nsa-tile="query-tile=4 kv-tile=32" --one-shot-bufferize="bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map" --nsa-map-to-gpu="kernel-block-sizes=window_attention=64" | FileCheck %s --check-prefix=SIZED
// RUN: not nsa-opt %s --nsa-tile="query-tile=4 kv-tile=32" --one-shot-bufferize="bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map" --nsa-map-to-gpu="kernel-block-sizes=window_attention=100" 2>&1 | FileCheck %s --check-prefix=BADSIZE

// The window branch's tiles on a GPU: one thread block per (KV head, query
// tile), its tiles carved out of dynamic shared memory, every linalg op and
// copy distributed over the 128 threads with a barrier after it, the
// output buffers allocated on the device.

// CHECK-LABEL: func.func @window
// CHECK: gpu.wait async
// CHECK: gpu.alloc async
// CHECK: gpu.launch blocks(%[[BX:.+]], %[[BY:.+]], %[[BZ:.+]]) in (%{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}) threads(%[[TX:.+]], %{{.+}}, %{{.+}}) in (%{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}) dynamic_shared_memory_size %{{.+}}
// CHECK: %[[SMEM:.+]] = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
// CHECK: memref.view %[[SMEM]][%{{.+}}][] : memref<?xi8, #gpu.address_space<workgroup>> to memref<4x4x72xbf16, #gpu.address_space<workgroup>>
// CHECK: memref.memory_space_cast
// CHECK: scf.for %{{.+}} = %[[TX]] to %{{.+}} step %{{.+}}
// CHECK: gpu.barrier
// The zeros after the last token's rows: 16-byte stores.
// CHECK: vector.broadcast %{{.+}} : bf16 to vector<8xbf16>
// CHECK: vector.store
// CHECK: scf.for
// CHECK: math.exp
// CHECK: gpu.barrier
// CHECK: gpu.terminator
// CHECK: gpu.dealloc async
// SIZED: gpu.launch {{.+}} threads(%{{.+}}, %{{.+}}, %{{.+}}) in (%{{.+}} = %c64{{.*}}, {{.+}}) dynamic_shared_memory_size {{.+}} module(@window_window_attention_0)
// BADSIZE: nsa-map-to-gpu: kernel-block-sizes entries are op=threads with threads a multiple of 32 in 32..1024, found 'window_attention=100'
// TOOBIG: nsa-map-to-gpu: the tiles need {{[0-9]+}} bytes of shared memory, more than the 232448 a block can have
func.func @window(%q: tensor<1x?x4x64xbf16>, %k: tensor<1x?x1x64xbf16>, %v: tensor<1x?x1x64xbf16>,
                  %out: memref<1x?x4x64xbf16>) {
  %o, %lse = nsa.window_attention %q, %k, %v {window = 64, scale = 0.125 : f32}
      : (tensor<1x?x4x64xbf16>, tensor<1x?x1x64xbf16>, tensor<1x?x1x64xbf16>)
      -> (tensor<1x?x4x64xbf16>, tensor<1x?x4xf32>)
  bufferization.materialize_in_destination %o in restrict writable %out
      : (tensor<1x?x4x64xbf16>, memref<1x?x4x64xbf16>) -> ()
  return
}
