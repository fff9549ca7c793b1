module @jit_window_ops attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=2, "model"=2]> {stablehlo.mesh = {axes = [{name = "data", size = 2 : i64}, {name = "model", size = 2 : i64}]}}
  func.func public @main(%arg0: tensor<2x8x8x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {}, {}]>}, %arg1: tensor<3x3x2x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {}, {}]>}, %arg2: tensor<4x3xi32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}, %arg3: tensor<6x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}, {}]>}) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<2x8x8x4xf32> {jax.result_info = "result[1][0]"}, tensor<3x3x2x4xf32> {jax.result_info = "result[1][1]"}, tensor<6x8xf32> {jax.result_info = "result[1][2]"}) {
    %0 = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[2, 2], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [2, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 2 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<2x8x8x4xf32>, tensor<3x3x2x4xf32>) -> tensor<2x8x8x4xf32>
    %1 = stablehlo.tanh %0 : tensor<2x8x8x4xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x8x8x4xf32>
    %3 = stablehlo.add %2, %1 : tensor<2x8x8x4xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %4 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x8x8x4xf32>
    %5 = stablehlo.subtract %4, %1 : tensor<2x8x8x4xf32>
    %6 = stablehlo.multiply %3, %5 : tensor<2x8x8x4xf32>
    %7 = sdy.sharding_constraint %1 <@mesh, [{"data"}, {"model"}, {}, {}]> : tensor<2x8x8x4xf32>
    %cst_1 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %8 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<f32>
    %9 = "stablehlo.reduce_window"(%7, %8) <{base_dilations = array<i64: 1, 1, 1, 1>, padding = dense<0> : tensor<4x2xi64>, window_dilations = array<i64: 1, 1, 1, 1>, window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: 1, 2, 2, 1>}> ({
    ^bb0(%arg4: tensor<f32>, %arg5: tensor<f32>):
      %69 = stablehlo.maximum %arg4, %arg5 : tensor<f32>
      stablehlo.return %69 : tensor<f32>
    }) : (tensor<2x8x8x4xf32>, tensor<f32>) -> tensor<2x4x4x4xf32>
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %10 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<f32>
    %11 = "stablehlo.reduce_window"(%7, %10) <{base_dilations = array<i64: 1, 1, 1, 1>, padding = dense<[[0, 0], [1, 1], [1, 1], [0, 0]]> : tensor<4x2xi64>, window_dilations = array<i64: 1, 1, 1, 1>, window_dimensions = array<i64: 1, 3, 3, 1>, window_strides = array<i64: 1, 1, 1, 1>}> ({
    ^bb0(%arg4: tensor<f32>, %arg5: tensor<f32>):
      %69 = stablehlo.add %arg4, %arg5 : tensor<f32>
      stablehlo.return %69 : tensor<f32>
    }) : (tensor<2x8x8x4xf32>, tensor<f32>) -> tensor<2x8x8x4xf32>
    %cst_3 = stablehlo.constant dense<9.000000e+00> : tensor<f32>
    %12 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x8x8x4xf32>
    %13 = stablehlo.divide %11, %12 : tensor<2x8x8x4xf32>
    %14 = stablehlo.transpose %arg1, dims = [0, 1, 3, 2] : (tensor<3x3x2x4xf32>) -> tensor<3x3x4x2xf32>
    %15 = stablehlo.convolution(%9, %14) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[2, 1], [2, 1]], lhs_dilate = [2, 2], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<2x4x4x4xf32>, tensor<3x3x4x2xf32>) -> tensor<2x8x8x2xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %16 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<4x3xi32>
    %17 = stablehlo.compare LT, %arg2, %16, SIGNED : (tensor<4x3xi32>, tensor<4x3xi32>) -> tensor<4x3xi1>
    %c_4 = stablehlo.constant dense<6> : tensor<i32>
    %18 = stablehlo.broadcast_in_dim %c_4, dims = [] : (tensor<i32>) -> tensor<4x3xi32>
    %19 = stablehlo.add %arg2, %18 : tensor<4x3xi32>
    %20 = stablehlo.select %17, %19, %arg2 : tensor<4x3xi1>, tensor<4x3xi32>
    %21 = stablehlo.broadcast_in_dim %20, dims = [0, 1] : (tensor<4x3xi32>) -> tensor<4x3x1xi32>
    %22 = "stablehlo.gather"(%arg3, %21) <{dimension_numbers = #stablehlo.gather<offset_dims = [2], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>}> : (tensor<6x8xf32>, tensor<4x3x1xi32>) -> tensor<4x3x8xf32>
    %23 = call @argmax(%22) : (tensor<4x3x8xf32>) -> tensor<4x3xi32>
    %24 = stablehlo.convert %23 : (tensor<4x3xi32>) -> tensor<4x3xf32>
    %25 = call @cumsum(%22) : (tensor<4x3x8xf32>) -> tensor<4x3x8xf32>
    %26 = stablehlo.multiply %15, %15 : tensor<2x8x8x2xf32>
    %cst_5 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %27 = stablehlo.reduce(%26 init: %cst_5) applies stablehlo.add across dimensions = [0, 1, 2, 3] : (tensor<2x8x8x2xf32>, tensor<f32>) -> tensor<f32>
    %cst_6 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %28 = stablehlo.reduce(%13 init: %cst_6) applies stablehlo.add across dimensions = [0, 1, 2, 3] : (tensor<2x8x8x4xf32>, tensor<f32>) -> tensor<f32>
    %29 = stablehlo.add %27, %28 : tensor<f32>
    %30 = stablehlo.multiply %25, %25 : tensor<4x3x8xf32>
    %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %31 = stablehlo.reduce(%30 init: %cst_7) applies stablehlo.add across dimensions = [0, 1, 2] : (tensor<4x3x8xf32>, tensor<f32>) -> tensor<f32>
    %32 = stablehlo.add %29, %31 : tensor<f32>
    %cst_8 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %33 = stablehlo.reduce(%24 init: %cst_8) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x3xf32>, tensor<f32>) -> tensor<f32>
    %34 = stablehlo.add %32, %33 : tensor<f32>
    %cst_9 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %35 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<4x3x8xf32>
    %36 = stablehlo.multiply %25, %35 : tensor<4x3x8xf32>
    %37 = stablehlo.multiply %35, %25 : tensor<4x3x8xf32>
    %38 = stablehlo.add %37, %36 : tensor<4x3x8xf32>
    %39 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<2x8x8x4xf32>
    %40 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<2x8x8x2xf32>
    %41 = stablehlo.multiply %15, %40 : tensor<2x8x8x2xf32>
    %42 = stablehlo.multiply %40, %15 : tensor<2x8x8x2xf32>
    %43 = stablehlo.add %42, %41 : tensor<2x8x8x2xf32>
    %44 = call @cumsum_1(%38) : (tensor<4x3x8xf32>) -> tensor<4x3x8xf32>
    %cst_10 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %45 = stablehlo.broadcast_in_dim %cst_10, dims = [] : (tensor<f32>) -> tensor<6x8xf32>
    %46 = "stablehlo.scatter"(%45, %21, %44) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [2], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 2>, unique_indices = false}> ({
    ^bb0(%arg4: tensor<f32>, %arg5: tensor<f32>):
      %69 = stablehlo.add %arg4, %arg5 : tensor<f32>
      stablehlo.return %69 : tensor<f32>
    }) : (tensor<6x8xf32>, tensor<4x3x1xi32>, tensor<4x3x8xf32>) -> tensor<6x8xf32>
    %47 = stablehlo.convolution(%9, %43) dim_numbers = [f, 0, 1, b]x[i, 0, 1, o]->[0, 1, b, f], window = {stride = [1, 1], pad = [[2, 1], [2, 1]], lhs_dilate = [2, 2], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<2x4x4x4xf32>, tensor<2x8x8x2xf32>) -> tensor<3x3x4x2xf32>
    %48 = stablehlo.reverse %14, dims = [0, 1] : tensor<3x3x4x2xf32>
    %49 = stablehlo.convolution(%43, %48) dim_numbers = [b, 0, 1, f]x[0, 1, o, i]->[b, 0, 1, f], window = {stride = [2, 2], pad = [[0, 1], [0, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<2x8x8x2xf32>, tensor<3x3x4x2xf32>) -> tensor<2x4x4x4xf32>
    %50 = stablehlo.transpose %47, dims = [0, 1, 3, 2] : (tensor<3x3x4x2xf32>) -> tensor<3x3x2x4xf32>
    %cst_11 = stablehlo.constant dense<9.000000e+00> : tensor<f32>
    %51 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<2x8x8x4xf32>
    %52 = stablehlo.divide %39, %51 : tensor<2x8x8x4xf32>
    %cst_12 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %53 = stablehlo.pad %52, %cst_12, low = [0, 1, 1, 0], high = [0, 1, 1, 0], interior = [0, 0, 0, 0] : (tensor<2x8x8x4xf32>, tensor<f32>) -> tensor<2x10x10x4xf32>
    %cst_13 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %54 = stablehlo.broadcast_in_dim %cst_13, dims = [] : (tensor<f32>) -> tensor<f32>
    %55 = "stablehlo.reduce_window"(%53, %54) <{base_dilations = array<i64: 1, 1, 1, 1>, padding = dense<0> : tensor<4x2xi64>, window_dilations = array<i64: 1, 1, 1, 1>, window_dimensions = array<i64: 1, 3, 3, 1>, window_strides = array<i64: 1, 1, 1, 1>}> ({
    ^bb0(%arg4: tensor<f32>, %arg5: tensor<f32>):
      %69 = stablehlo.add %arg4, %arg5 : tensor<f32>
      stablehlo.return %69 : tensor<f32>
    }) : (tensor<2x10x10x4xf32>, tensor<f32>) -> tensor<2x8x8x4xf32>
    %cst_14 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %56 = stablehlo.pad %7, %cst_14, low = [0, 0, 0, 0], high = [0, 0, 0, 0], interior = [0, 0, 0, 0] : (tensor<2x8x8x4xf32>, tensor<f32>) -> tensor<2x8x8x4xf32>
    %cst_15 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %57 = "stablehlo.select_and_scatter"(%56, %49, %cst_15) <{padding = dense<0> : tensor<4x2xi64>, window_dimensions = array<i64: 1, 2, 2, 1>, window_strides = array<i64: 1, 2, 2, 1>}> ({
    ^bb0(%arg4: tensor<f32>, %arg5: tensor<f32>):
      %69 = stablehlo.compare GE, %arg4, %arg5, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      stablehlo.return %69 : tensor<i1>
    }, {
    ^bb0(%arg4: tensor<f32>, %arg5: tensor<f32>):
      %69 = stablehlo.add %arg4, %arg5 : tensor<f32>
      stablehlo.return %69 : tensor<f32>
    }) : (tensor<2x8x8x4xf32>, tensor<2x4x4x4xf32>, tensor<f32>) -> tensor<2x8x8x4xf32>
    %58 = stablehlo.slice %57 [0:2, 0:8, 0:8, 0:4] : (tensor<2x8x8x4xf32>) -> tensor<2x8x8x4xf32>
    %59 = stablehlo.add %55, %58 : tensor<2x8x8x4xf32>
    %60 = sdy.sharding_constraint %59 <@mesh, [{"data"}, {"model"}, {}, {}]> : tensor<2x8x8x4xf32>
    %61 = stablehlo.multiply %60, %6 : tensor<2x8x8x4xf32>
    %62 = stablehlo.convolution(%arg0, %61) dim_numbers = [f, 0, 1, b]x[i, 0, 1, o]->[0, 1, b, f], window = {stride = [2, 1], pad = [[2, 2], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 2 : i64, feature_group_count = 1 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<2x8x8x4xf32>, tensor<2x8x8x4xf32>) -> tensor<3x3x2x4xf32>
    %63 = stablehlo.add %50, %62 : tensor<3x3x2x4xf32>
    %64 = stablehlo.reshape %arg1 : (tensor<3x3x2x4xf32>) -> tensor<3x3x2x2x2xf32>
    %65 = stablehlo.transpose %64, dims = [0, 1, 3, 2, 4] : (tensor<3x3x2x2x2xf32>) -> tensor<3x3x2x2x2xf32>
    %66 = stablehlo.reshape %65 : (tensor<3x3x2x2x2xf32>) -> tensor<3x3x4x2xf32>
    %67 = stablehlo.reverse %66, dims = [0, 1] : tensor<3x3x4x2xf32>
    %68 = stablehlo.convolution(%61, %67) dim_numbers = [b, 0, 1, f]x[0, 1, o, i]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[2, 2], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [2, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 2 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<2x8x8x4xf32>, tensor<3x3x4x2xf32>) -> tensor<2x8x8x4xf32>
    return %34, %68, %63, %46 : tensor<f32>, tensor<2x8x8x4xf32>, tensor<3x3x2x4xf32>, tensor<6x8xf32>
  }
  func.func private @argmax(%arg0: tensor<4x3x8xf32>) -> tensor<4x3xi32> {
    %0 = stablehlo.iota dim = 2 : tensor<4x3x8xi32>
    %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1:2 = stablehlo.reduce(%arg0 init: %cst), (%0 init: %c) across dimensions = [2] : (tensor<4x3x8xf32>, tensor<4x3x8xi32>, tensor<f32>, tensor<i32>) -> (tensor<4x3xf32>, tensor<4x3xi32>)
     reducer(%arg1: tensor<f32>, %arg3: tensor<f32>) (%arg2: tensor<i32>, %arg4: tensor<i32>)  {
      %2 = stablehlo.compare GT, %arg1, %arg3, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %3 = stablehlo.compare NE, %arg1, %arg1, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %4 = stablehlo.or %2, %3 : tensor<i1>
      %5 = stablehlo.compare EQ, %arg1, %arg3, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %6 = stablehlo.compare LT, %arg2, %arg4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %7 = stablehlo.and %5, %6 : tensor<i1>
      %8 = stablehlo.or %4, %7 : tensor<i1>
      %9 = stablehlo.select %4, %arg1, %arg3 : tensor<i1>, tensor<f32>
      %10 = stablehlo.select %8, %arg2, %arg4 : tensor<i1>, tensor<i32>
      stablehlo.return %9, %10 : tensor<f32>, tensor<i32>
    }
    return %1#1 : tensor<4x3xi32>
  }
  func.func private @cumsum(%arg0: tensor<4x3x8xf32>) -> tensor<4x3x8xf32> {
    %0 = call @cumsum_0(%arg0) : (tensor<4x3x8xf32>) -> tensor<4x3x8xf32>
    return %0 : tensor<4x3x8xf32>
  }
  func.func private @cumsum_0(%arg0: tensor<4x3x8xf32>) -> tensor<4x3x8xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<f32>
    %1 = "stablehlo.reduce_window"(%arg0, %0) <{base_dilations = array<i64: 1, 1, 1>, padding = dense<[[0, 0], [2, 0], [0, 0]]> : tensor<3x2xi64>, window_dilations = array<i64: 1, 1, 1>, window_dimensions = array<i64: 1, 3, 1>, window_strides = array<i64: 1, 1, 1>}> ({
    ^bb0(%arg1: tensor<f32>, %arg2: tensor<f32>):
      %2 = stablehlo.add %arg1, %arg2 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<4x3x8xf32>, tensor<f32>) -> tensor<4x3x8xf32>
    return %1 : tensor<4x3x8xf32>
  }
  func.func private @cumsum_1(%arg0: tensor<4x3x8xf32>) -> tensor<4x3x8xf32> {
    %0 = call @cumsum_2(%arg0) : (tensor<4x3x8xf32>) -> tensor<4x3x8xf32>
    return %0 : tensor<4x3x8xf32>
  }
  func.func private @cumsum_2(%arg0: tensor<4x3x8xf32>) -> tensor<4x3x8xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<f32>
    %1 = "stablehlo.reduce_window"(%arg0, %0) <{base_dilations = array<i64: 1, 1, 1>, padding = dense<[[0, 0], [0, 2], [0, 0]]> : tensor<3x2xi64>, window_dilations = array<i64: 1, 1, 1>, window_dimensions = array<i64: 1, 3, 1>, window_strides = array<i64: 1, 1, 1>}> ({
    ^bb0(%arg1: tensor<f32>, %arg2: tensor<f32>):
      %2 = stablehlo.add %arg1, %arg2 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<4x3x8xf32>, tensor<f32>) -> tensor<4x3x8xf32>
    return %1 : tensor<4x3x8xf32>
  }
}
