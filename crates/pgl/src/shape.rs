//! PGL shapes (batch, depth, rows, cols) and tile coordinates. The coordinate math is the C
//! definition in `kernels/include/weft/abi/pgl.h`, compiled for the host from the same source the
//! kernels include; this module only adds safe wrappers and validation.

use crate::error::PglError;
use weft_kernels::abi::{self, weft_pgl_shape, weft_tile_coord};

/// Same on every rank of a PGL. Every dimension is at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub batch: u32,
    pub depth: u32,
    pub rows: u32,
    pub cols: u32,
}

impl Shape {
    pub fn new(batch: u32, depth: u32, rows: u32, cols: u32) -> Self {
        Self {
            batch,
            depth,
            rows,
            cols,
        }
    }

    /// (1, 1, 1, n): a flat buffer of n elements.
    pub fn vector(n: u32) -> Self {
        Self::new(1, 1, 1, n)
    }

    pub fn elems(&self) -> u64 {
        // SAFETY: pure arithmetic on a by-value struct.
        unsafe { abi::weft_pgl_elems(self.raw()) }
    }

    pub fn raw(&self) -> weft_pgl_shape {
        weft_pgl_shape {
            batch: self.batch,
            depth: self.depth,
            rows: self.rows,
            cols: self.cols,
        }
    }

    /// `PglError::Shape` on a zero dimension, naming it.
    pub fn validate(&self) -> Result<(), PglError> {
        for (name, v) in [
            ("batch", self.batch),
            ("depth", self.depth),
            ("rows", self.rows),
            ("cols", self.cols),
        ] {
            if v < 1 {
                return Err(PglError::Shape(format!(
                    "shape {self}: {name} is 0 (every dimension must be at least 1)"
                )));
            }
        }
        Ok(())
    }

    /// Row-major offset of element (b, d, row, col).
    pub fn offset(&self, b: u32, d: u32, row: u32, col: u32) -> u64 {
        // SAFETY: pure arithmetic.
        unsafe { abi::weft_elem_offset(self.raw(), b, d, row, col) }
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "({}, {}, {}, {})",
            self.batch, self.depth, self.rows, self.cols
        )
    }
}

/// A tiling of a shape into tile_rows × tile_cols tiles (ragged at the bottom and right edges).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileGrid {
    pub shape: Shape,
    pub tile_rows: u32,
    pub tile_cols: u32,
}

/// A tile's coordinate: batch, depth, tile row, tile column.
pub type TileCoord = weft_tile_coord;

impl TileGrid {
    /// `PglError::Shape` for a shape or tile with a zero side.
    pub fn new(shape: Shape, tile_rows: u32, tile_cols: u32) -> Result<Self, PglError> {
        shape.validate()?;
        if tile_rows < 1 || tile_cols < 1 {
            return Err(PglError::Shape(format!(
                "tile shape {tile_rows}×{tile_cols} has a zero side"
            )));
        }
        Ok(Self {
            shape,
            tile_rows,
            tile_cols,
        })
    }

    pub fn count(&self) -> u64 {
        // SAFETY: pure arithmetic.
        unsafe { abi::weft_tile_count(self.shape.raw(), self.tile_rows, self.tile_cols) }
    }

    /// The coordinate of the tile with row-major index `linear` (< count()).
    pub fn coord(&self, linear: u64) -> TileCoord {
        debug_assert!(linear < self.count());
        // SAFETY: pure arithmetic.
        unsafe { abi::weft_tile_coord_of(self.shape.raw(), self.tile_rows, self.tile_cols, linear) }
    }

    pub fn linear(&self, t: TileCoord) -> u64 {
        // SAFETY: pure arithmetic.
        unsafe { abi::weft_tile_linear(self.shape.raw(), self.tile_rows, self.tile_cols, t) }
    }

    /// Element offset of the tile's first element.
    pub fn origin(&self, t: TileCoord) -> u64 {
        // SAFETY: pure arithmetic.
        unsafe { abi::weft_tile_origin(self.shape.raw(), self.tile_rows, self.tile_cols, t) }
    }

    /// (rows, cols) of the tile inside the shape.
    pub fn valid(&self, t: TileCoord) -> (u32, u32) {
        // SAFETY: pure arithmetic.
        unsafe {
            (
                abi::weft_tile_valid_rows(self.shape.raw(), self.tile_rows, t),
                abi::weft_tile_valid_cols(self.shape.raw(), self.tile_cols, t),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent reference: walk every element, find its tile by division, and check that the
    /// grid's coordinates, origins and valid extents cover each element exactly once.
    fn check_grid(shape: Shape, tr: u32, tc: u32) {
        let g = TileGrid::new(shape, tr, tc).unwrap();
        let tiles_r = shape.rows.div_ceil(tr);
        let tiles_c = shape.cols.div_ceil(tc);
        assert_eq!(
            g.count(),
            (shape.batch * shape.depth * tiles_r * tiles_c) as u64
        );
        let mut covered = vec![0u8; shape.elems() as usize];
        for linear in 0..g.count() {
            let t = g.coord(linear);
            assert_eq!(g.linear(t), linear);
            let (vr, vc) = g.valid(t);
            assert_eq!(vr, tr.min(shape.rows - t.r * tr));
            assert_eq!(vc, tc.min(shape.cols - t.c * tc));
            assert_eq!(g.origin(t), shape.offset(t.b, t.d, t.r * tr, t.c * tc));
            for i in 0..vr {
                for j in 0..vc {
                    let row = t.r * tr + i;
                    let col = t.c * tc + j;
                    let off = (((t.b as u64 * shape.depth as u64 + t.d as u64) * shape.rows as u64
                        + row as u64)
                        * shape.cols as u64
                        + col as u64) as usize;
                    covered[off] += 1;
                }
            }
        }
        assert!(
            covered.iter().all(|&c| c == 1),
            "{shape} tiled {tr}×{tc}: not a partition"
        );
    }

    #[test]
    fn tiles_partition_even_and_ragged_shapes() {
        check_grid(Shape::new(1, 1, 128, 256), 64, 64);
        check_grid(Shape::new(2, 3, 17, 33), 8, 16);
        check_grid(Shape::new(1, 1, 1, 1), 64, 64);
        check_grid(Shape::new(3, 1, 130, 7), 128, 8);
        check_grid(Shape::vector(1000), 1, 256);
    }

    #[test]
    fn zero_dimensions_are_rejected_by_name() {
        let e = Shape::new(1, 0, 4, 4).validate().unwrap_err().to_string();
        assert!(e.contains("depth is 0"), "{e}");
        assert!(TileGrid::new(Shape::vector(4), 0, 4).is_err());
    }

    #[test]
    fn offsets_are_row_major() {
        let s = Shape::new(2, 3, 4, 5);
        assert_eq!(s.elems(), 120);
        assert_eq!(s.offset(1, 2, 3, 4), 119);
        assert_eq!(s.offset(0, 1, 0, 0), 20);
    }
}
