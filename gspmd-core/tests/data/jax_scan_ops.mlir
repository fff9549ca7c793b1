module @jit_scan_ops attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=2, "model"=4]> {stablehlo.mesh = {axes = [{name = "data", size = 2 : i64}, {name = "model", size = 4 : i64}]}}
  func.func public @main(%arg0: tensor<5x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}, %arg1: tensor<16x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>}, %arg2: tensor<4xi32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>}) -> (tensor<8x16xf32> {jax.result_info = "result[0]"}, tensor<5x16xf32> {jax.result_info = "result[1]"}) {
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8x16xf32>
    %1 = sdy.sharding_constraint %0 <@mesh, [{"data"}, {"model"}]> : tensor<8x16xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<5x16xf32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %3:7 = stablehlo.while(%iterArg = %arg0, %iterArg_2 = %arg1, %iterArg_3 = %arg2, %iterArg_4 = %c_1, %iterArg_5 = %1, %iterArg_6 = %c, %iterArg_7 = %2) : tensor<5x16xf32>, tensor<16x16xf32>, tensor<4xi32>, tensor<i32>, tensor<8x16xf32>, tensor<i32>, tensor<5x16xf32>
    cond {
      %c_8 = stablehlo.constant dense<5> : tensor<i32>
      %4 = stablehlo.compare LT, %iterArg_4, %c_8, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %4 : tensor<i1>
    } do {
      %4 = func.call @dynamic_index_in_dim(%iterArg, %iterArg_4) : (tensor<5x16xf32>, tensor<i32>) -> tensor<16xf32>
      %c_8 = stablehlo.constant dense<3> : tensor<i32>
      %5 = func.call @remainder(%iterArg_6, %c_8) : (tensor<i32>, tensor<i32>) -> tensor<i32>
      %c_9 = stablehlo.constant dense<0> : tensor<i32>
      %c_10 = stablehlo.constant dense<2> : tensor<i32>
      %6 = stablehlo.clamp %c_9, %5, %c_10 : tensor<i32>
      %c_11 = stablehlo.constant dense<0> : tensor<i32>
      %7 = stablehlo.compare LT, %6, %c_11, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %c_12 = stablehlo.constant dense<8> : tensor<i32>
      %8 = stablehlo.add %6, %c_12 : tensor<i32>
      %9 = stablehlo.select %7, %8, %6 : tensor<i1>, tensor<i32>
      %c_13 = stablehlo.constant dense<0> : tensor<i32>
      %10 = stablehlo.dynamic_slice %iterArg_5, %9, %c_13, sizes = [2, 16] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<2x16xf32>
      %11 = stablehlo.dot_general %10, %iterArg_2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x16xf32>, tensor<16x16xf32>) -> tensor<2x16xf32>
      %12 = stablehlo.broadcast_in_dim %4, dims = [1] : (tensor<16xf32>) -> tensor<1x16xf32>
      %13 = stablehlo.broadcast_in_dim %12, dims = [0, 1] : (tensor<1x16xf32>) -> tensor<2x16xf32>
      %14 = stablehlo.add %11, %13 : tensor<2x16xf32>
      %15 = stablehlo.tanh %14 : tensor<2x16xf32>
      %cst_14 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %16 = stablehlo.reduce(%15 init: %cst_14) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x16xf32>, tensor<f32>) -> tensor<f32>
      %cst_15 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %17 = stablehlo.compare GT, %16, %cst_15, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %18 = stablehlo.convert %17 : (tensor<i1>) -> tensor<i32>
      %19 = "stablehlo.case"(%18) ({
        %35 = stablehlo.negate %15 : tensor<2x16xf32>
        stablehlo.return %35 : tensor<2x16xf32>
      }, {
        %35 = stablehlo.sine %15 : tensor<2x16xf32>
        stablehlo.return %35 : tensor<2x16xf32>
      }) : (tensor<i32>) -> tensor<2x16xf32>
      %c_16 = stablehlo.constant dense<4> : tensor<i32>
      %20 = func.call @remainder(%iterArg_6, %c_16) : (tensor<i32>, tensor<i32>) -> tensor<i32>
      %c_17 = stablehlo.constant dense<0> : tensor<i32>
      %21 = stablehlo.compare LT, %20, %c_17, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %c_18 = stablehlo.constant dense<4> : tensor<i32>
      %22 = stablehlo.add %20, %c_18 : tensor<i32>
      %23 = stablehlo.select %21, %22, %20 : tensor<i1>, tensor<i32>
      %24 = stablehlo.dynamic_slice %iterArg_3, %23, sizes = [1] : (tensor<4xi32>, tensor<i32>) -> tensor<1xi32>
      %25 = stablehlo.reshape %24 : (tensor<1xi32>) -> tensor<i32>
      %c_19 = stablehlo.constant dense<0> : tensor<i32>
      %26 = stablehlo.compare LT, %25, %c_19, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %c_20 = stablehlo.constant dense<8> : tensor<i32>
      %27 = stablehlo.add %25, %c_20 : tensor<i32>
      %28 = stablehlo.select %26, %27, %25 : tensor<i1>, tensor<i32>
      %c_21 = stablehlo.constant dense<0> : tensor<i32>
      %29 = stablehlo.dynamic_update_slice %iterArg_5, %19, %28, %c_21 : (tensor<8x16xf32>, tensor<2x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x16xf32>
      %30 = func.call @_roll_static(%29) : (tensor<8x16xf32>) -> tensor<8x16xf32>
      %c_22 = stablehlo.constant dense<1> : tensor<i32>
      %31 = stablehlo.add %iterArg_6, %c_22 : tensor<i32>
      %cst_23 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %32 = stablehlo.reduce(%19 init: %cst_23) applies stablehlo.add across dimensions = [0] : (tensor<2x16xf32>, tensor<f32>) -> tensor<16xf32>
      %33 = func.call @dynamic_update_index_in_dim(%iterArg_7, %32, %iterArg_4) : (tensor<5x16xf32>, tensor<16xf32>, tensor<i32>) -> tensor<5x16xf32>
      %c_24 = stablehlo.constant dense<1> : tensor<i32>
      %34 = stablehlo.add %iterArg_4, %c_24 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_2, %iterArg_3, %34, %30, %31, %33 : tensor<5x16xf32>, tensor<16x16xf32>, tensor<4xi32>, tensor<i32>, tensor<8x16xf32>, tensor<i32>, tensor<5x16xf32>
    }
    return %3#4, %3#6 : tensor<8x16xf32>, tensor<5x16xf32>
  }
  func.func private @dynamic_index_in_dim(%arg0: tensor<5x16xf32>, %arg1: tensor<i32>) -> tensor<16xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.dynamic_slice %arg0, %arg1, %c, sizes = [1, 16] : (tensor<5x16xf32>, tensor<i32>, tensor<i32>) -> tensor<1x16xf32>
    %1 = stablehlo.reshape %0 : (tensor<1x16xf32>) -> tensor<16xf32>
    return %1 : tensor<16xf32>
  }
  func.func private @remainder(%arg0: tensor<i32>, %arg1: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.compare EQ, %0, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %2 = call @_where(%1, %c_0, %0) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %3 = stablehlo.remainder %arg0, %2 : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %4 = stablehlo.compare NE, %3, %c_1, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %5 = stablehlo.compare LT, %3, %c_2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %6 = stablehlo.compare LT, %2, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %7 = stablehlo.compare NE, %5, %6, UNSIGNED : (tensor<i1>, tensor<i1>) -> tensor<i1>
    %8 = stablehlo.and %7, %4 : tensor<i1>
    %9 = stablehlo.add %3, %2 : tensor<i32>
    %10 = stablehlo.select %8, %9, %3 : tensor<i1>, tensor<i32>
    return %10 : tensor<i32>
  }
  func.func private @_where(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @_roll_static(%arg0: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = stablehlo.slice %arg0 [0:8, 15:16] : (tensor<8x16xf32>) -> tensor<8x1xf32>
    %1 = stablehlo.slice %arg0 [0:8, 0:15] : (tensor<8x16xf32>) -> tensor<8x15xf32>
    %2 = stablehlo.concatenate %0, %1, dim = 1 : (tensor<8x1xf32>, tensor<8x15xf32>) -> tensor<8x16xf32>
    return %2 : tensor<8x16xf32>
  }
  func.func private @dynamic_update_index_in_dim(%arg0: tensor<5x16xf32>, %arg1: tensor<16xf32>, %arg2: tensor<i32>) -> tensor<5x16xf32> {
    %0 = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<16xf32>) -> tensor<1x16xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.dynamic_update_slice %arg0, %0, %arg2, %c : (tensor<5x16xf32>, tensor<1x16xf32>, tensor<i32>, tensor<i32>) -> tensor<5x16xf32>
    return %1 : tensor<5x16xf32>
  }
}
