//! `longshore-derive` is the proc-macro crate behind `#[derive(Sample)]`: a struct whose
//! fields are tensor fields (elements, arrays, `Vec`s, `Tensor`s) becomes a dataset item
//! that `StackCollate`/`PadCollate` batch field by field, in declaration order.
//!
//! Use it through `longshore_data::Sample` or `longshore::data::Sample` (the derive is
//! re-exported next to the trait of the same name, as serde does):
//!
//! ```ignore
//! use longshore_data::Sample;
//!
//! #[derive(Sample)]
//! struct Item {
//!     image: [[f32; 4]; 4], // tensor 0: [batch, 4, 4] f32
//!     label: i64,           // tensor 1: [batch] i64
//!     #[sample(skip)]
//!     path: String,         // not a tensor: left out of the batch
//! }
//! ```
//!
//! Attributes: `#[sample(skip)]` on a field leaves it out; `#[sample(crate = "path")]` on
//! the struct names the crate that holds the `Sample` trait, when it is reached neither as
//! `longshore-data` nor as the `longshore` facade (for example under a renamed dependency
//! this macro cannot see).
#![forbid(unsafe_code)]

use proc_macro::TokenStream;
use proc_macro_crate::{FoundCrate, crate_name};
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Ident, LitStr, Path, parse_macro_input, parse_quote};

/// Implements `Sample` for a struct of tensor fields: field `i` of the sample is the
/// struct's `i`-th field not marked `#[sample(skip)]`, viewed through `Field::tensor_ref`.
///
/// Works on structs with named or unnamed fields, generic or not (each field's type
/// must implement `Field`). Enums, unions and structs without tensor fields are refused.
#[proc_macro_derive(Sample, attributes(sample))]
pub fn derive_sample(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

fn expand(input: DeriveInput) -> syn::Result<TokenStream2> {
    let krate = data_crate(&input)?;
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new(
            Span::call_site(),
            "#[derive(Sample)] works on structs only: a sample is a fixed list of tensor fields",
        ));
    };
    let fields: Vec<_> = match &data.fields {
        Fields::Named(f) => f.named.iter().collect(),
        Fields::Unnamed(f) => f.unnamed.iter().collect(),
        Fields::Unit => Vec::new(),
    };
    let mut arms = Vec::new();
    let mut bounds = Vec::new();
    for (pos, field) in fields.iter().enumerate() {
        if is_skipped(field)? {
            continue;
        }
        let member = match &field.ident {
            Some(ident) => quote!(#ident),
            None => {
                let index = syn::Index::from(pos);
                quote!(#index)
            }
        };
        let ty = &field.ty;
        let i = arms.len();
        // Spanned at the field's type, so a type that is not a tensor field is reported there.
        arms.push(quote_spanned! {ty.span()=>
            #i => ::core::option::Option::Some(#krate::Field::tensor_ref(&self.#member)),
        });
        bounds.push(quote_spanned! {ty.span()=> #ty: #krate::Field });
    }
    if arms.is_empty() {
        return Err(syn::Error::new(
            Span::call_site(),
            "#[derive(Sample)] needs at least one tensor field (one not marked #[sample(skip)])",
        ));
    }
    let n = arms.len();
    let name = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    // Field bounds only for generic structs: there they are what makes the impl well-formed;
    // on a concrete struct the call sites above report a bad field more precisely.
    let where_clause = if input.generics.params.is_empty() {
        quote!(#where_clause)
    } else {
        let existing = where_clause.into_iter().flat_map(|w| w.predicates.iter());
        quote!(where #(#existing,)* #(#bounds,)*)
    };
    Ok(quote! {
        impl #impl_generics #krate::Sample for #name #ty_generics #where_clause {
            fn num_fields(&self) -> usize {
                #n
            }
            fn field(&self, i: usize) -> ::core::option::Option<#krate::TensorRef<'_>> {
                match i {
                    #(#arms)*
                    _ => ::core::option::Option::None,
                }
            }
        }
    })
}

/// The path of the crate holding `Sample`, `Field` and `TensorRef`: `#[sample(crate = ..)]`,
/// else `longshore-data` when the user depends on it, else `longshore::data`.
fn data_crate(input: &DeriveInput) -> syn::Result<Path> {
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("sample")) {
        let mut found = None;
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                let lit: LitStr = meta.value()?.parse()?;
                found = Some(lit.parse::<Path>()?);
                Ok(())
            } else {
                Err(meta
                    .error("unknown #[sample] attribute on a struct; expected `crate = \"path\"`"))
            }
        })?;
        if let Some(path) = found {
            return Ok(path);
        }
    }
    // A crate's own tests and doctests see it as an external crate; `Itself` is handled by
    // `extern crate self as longshore_data` in longshore-data's lib.rs.
    match crate_name("longshore-data") {
        Ok(FoundCrate::Itself) => return Ok(parse_quote!(::longshore_data)),
        Ok(FoundCrate::Name(name)) => {
            let ident = Ident::new(&name, Span::call_site());
            return Ok(parse_quote!(::#ident));
        }
        Err(_) => {}
    }
    match crate_name("longshore") {
        Ok(FoundCrate::Itself) => Ok(parse_quote!(crate::data)),
        Ok(FoundCrate::Name(name)) => {
            let ident = Ident::new(&name, Span::call_site());
            Ok(parse_quote!(::#ident::data))
        }
        Err(_) => Err(syn::Error::new(
            Span::call_site(),
            "#[derive(Sample)] found neither `longshore-data` nor `longshore` among this \
             crate's dependencies; add one, or name the crate with #[sample(crate = \"path\")]",
        )),
    }
}

/// Whether `field` carries `#[sample(skip)]`.
fn is_skipped(field: &syn::Field) -> syn::Result<bool> {
    let mut skip = false;
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("sample")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                skip = true;
                Ok(())
            } else {
                Err(meta.error("unknown #[sample] attribute on a field; expected `skip`"))
            }
        })?;
    }
    Ok(skip)
}
