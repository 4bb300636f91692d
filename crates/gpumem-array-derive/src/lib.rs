//! `#[derive(ToDevice)]` for gpumem-array: implements `gpumem_array::ToDevice` for a struct
//! whose fields implement it, makes the twin struct of device arrays, and implements
//! `gpumem_array::ToHost` on the twin back to the struct.
//!
//! ```text
//! #[derive(ToDevice)]
//! struct Batch { tokens: HostArray<u32>, mask: HostArray<u8>, labels: Option<HostArray<i64>> }
//! // generates:
//! struct BatchOnDevice { tokens: DeviceArray<u32>, mask: DeviceArray<u8>, labels: Option<DeviceArray<i64>> }
//! ```
//!
//! Attributes: `#[gpumem(device = "Name")]` names the twin (default `<Struct>OnDevice`);
//! `#[gpumem(upload_only)]` leaves out `ToHost` (for fields that download into another type,
//! such as `PinnedHostArray`). The twin has the struct's visibility and its fields theirs.
//! Named and tuple structs without generic parameters are supported; anything else is a
//! compile error that says so.

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::{format_ident, quote};
use syn::{parse_macro_input, Data, DeriveInput, Fields, Ident, LitStr};

/// Derives `gpumem_array::ToDevice` (and `ToHost` on the generated twin); see the crate
/// documentation.
#[proc_macro_derive(ToDevice, attributes(gpumem))]
pub fn derive_to_device(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

fn expand(input: &DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let host = &input.ident;
    let mut device = format_ident!("{}OnDevice", host);
    let mut upload_only = false;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("gpumem")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("device") {
                let name: LitStr = meta.value()?.parse()?;
                device = Ident::new(&name.value(), name.span());
                Ok(())
            } else if meta.path.is_ident("upload_only") {
                upload_only = true;
                Ok(())
            } else {
                Err(meta
                    .error("unknown gpumem attribute; accepted: device = \"Name\", upload_only"))
            }
        })?;
    }
    if !input.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &input.generics,
            "#[derive(ToDevice)] does not support generic structs yet",
        ));
    }
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new(
            Span::call_site(),
            "#[derive(ToDevice)] supports structs only",
        ));
    };
    let vis = &input.vis;
    let fields: Vec<_> = data.fields.iter().collect();
    let types: Vec<_> = fields.iter().map(|f| &f.ty).collect();
    let field_vis: Vec<_> = fields.iter().map(|f| &f.vis).collect();
    let doc = format!("`{host}` with its host arrays on the device (from `#[derive(ToDevice)]`).");
    let array = quote!(::gpumem_array);

    let (definition, upload, download) = match &data.fields {
        Fields::Named(_) => {
            let names: Vec<_> = fields.iter().map(|f| f.ident.as_ref()).collect();
            (
                quote! {
                    #[doc = #doc]
                    #vis struct #device {
                        #( #field_vis #names: <#types as #array::ToDevice>::Device, )*
                    }
                },
                quote!(#device { #( #names: #array::ToDevice::upload_with(&self.#names, uploader)?, )* }),
                quote!(#host { #( #names: #array::ToHost::to_host(&self.#names)?, )* }),
            )
        }
        Fields::Unnamed(_) => {
            let index: Vec<_> = (0..fields.len()).map(syn::Index::from).collect();
            (
                quote! {
                    #[doc = #doc]
                    #vis struct #device( #( #field_vis <#types as #array::ToDevice>::Device, )* );
                },
                quote!(#device( #( #array::ToDevice::upload_with(&self.#index, uploader)?, )* )),
                quote!(#host( #( #array::ToHost::to_host(&self.#index)?, )* )),
            )
        }
        Fields::Unit => (
            quote! {
                #[doc = #doc]
                #vis struct #device;
            },
            quote!(#device),
            quote!(#host),
        ),
    };
    let to_host = (!upload_only).then(|| {
        quote! {
            impl #array::ToHost for #device {
                type Host = #host;

                fn to_host(&self) -> ::core::result::Result<#host, #array::ArrayError> {
                    ::core::result::Result::Ok(#download)
                }
            }
        }
    });
    Ok(quote! {
        #definition

        impl #array::ToDevice for #host {
            type Device = #device;

            fn upload_with(
                &self,
                uploader: &mut #array::Uploader<'_, '_>,
            ) -> ::core::result::Result<#device, #array::ArrayError> {
                let _ = &uploader; // a unit struct uploads nothing
                ::core::result::Result::Ok(#upload)
            }
        }

        #to_host
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(input: DeriveInput) -> String {
        expand(&input).unwrap_err().to_string()
    }

    #[test]
    fn unsupported_inputs_are_errors_that_say_what_is_accepted() {
        let generic: DeriveInput = syn::parse_quote!(
            struct B<T> {
                x: T,
            }
        );
        assert!(error_of(generic).contains("generic"));
        let an_enum: DeriveInput = syn::parse_quote!(
            enum E {
                A,
            }
        );
        assert!(error_of(an_enum).contains("structs only"));
        let unknown: DeriveInput = syn::parse_quote!(
            #[gpumem(colour = "red")]
            struct B {
                x: u8,
            }
        );
        assert!(error_of(unknown).contains("accepted: device = \"Name\", upload_only"));
    }

    #[test]
    fn the_twin_is_named_as_asked_and_to_host_can_be_left_out() {
        let named: DeriveInput = syn::parse_quote!(
            #[gpumem(device = "OnGpu", upload_only)]
            pub struct B {
                pub x: A,
            }
        );
        let code = expand(&named).unwrap().to_string();
        assert!(code.contains("pub struct OnGpu"), "{code}");
        assert!(!code.contains("ToHost"), "{code}");
        let plain: DeriveInput = syn::parse_quote!(
            struct B(A, C);
        );
        let code = expand(&plain).unwrap().to_string();
        assert!(code.contains("struct BOnDevice"), "{code}");
        assert!(code.contains("ToHost for BOnDevice"), "{code}");
    }
}
