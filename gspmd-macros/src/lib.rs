//! Procedural macros for gspmd. The `#[gspmd::model]` attribute arrives with the DSL
//! issue; until then this crate only reserves its place in the workspace.
