// RUN: nsa-opt %s --nsa-map-to-gpu --split-input-file --verify-diagnostics

// A tile that reads a constant tensor bufferized to a host global (here
// hoisted out of the loop) is refused: the kernel would read host memory.

memref.global "private" constant @table : memref<4xf32> = dense<[1.0, 2.0, 3.0, 4.0]>

func.func @hoisted_host_global(%out: memref<8x4xf32>) {
  %table = memref.get_global @table : memref<4xf32>
  scf.forall (%i) in (8) {
    %row = memref.subview %out[%i, 0] [1, 4] [1, 1] : memref<8x4xf32> to memref<4xf32, strided<[1], offset: ?>>
    // expected-error @below {{a tile reads a host global}}
    memref.copy %table, %row : memref<4xf32> to memref<4xf32, strided<[1], offset: ?>>
  }
  return
}

// -----

memref.global "private" constant @table2 : memref<4xf32> = dense<[1.0, 2.0, 3.0, 4.0]>

func.func @host_global_in_tile(%out: memref<8x4xf32>) {
  scf.forall (%i) in (8) {
    %table = memref.get_global @table2 : memref<4xf32>
    %row = memref.subview %out[%i, 0] [1, 4] [1, 1] : memref<8x4xf32> to memref<4xf32, strided<[1], offset: ?>>
    // expected-error @below {{a tile reads a host global}}
    memref.copy %table, %row : memref<4xf32> to memref<4xf32, strided<[1], offset: ?>>
  }
  return
}
